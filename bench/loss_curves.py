#!/usr/bin/env python3
"""Loss curves of runs that differ only in how they compute (FP8 products, a compressed wire) against
the exact run, from their metrics files (`fsdp train --metrics`): every validation point's relative
difference, the final one, the largest, and loss spikes in training (a step whose loss exceeds the
exact run's at the same step by more than --spike, after both are smoothed over --window steps).

  python3 bench/loss_curves.py --baseline none=M0.jsonl tensorwise=M1.jsonl rowwise=M2.jsonl \
      --bar 0.01 --title "..." --out bench/results/DATE-DEVICE-NAME.md

Prints the table and writes it (Markdown, with the validation curves) to --out when given. Exit status
0 when every run ends within --bar of the baseline's final validation loss with no spike, 1 otherwise:
it measures, and says which run missed.
"""
import argparse
import json
import sys


def read(path):
    steps, summary = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "summary" in r:
                summary = r
            elif "step" in r:
                steps.append(r)
    if not steps:
        sys.exit("loss_curves: %s holds no step records" % path)
    return steps, summary or {}


def smoothed(steps, window):
    out, acc = {}, []
    for r in steps:
        if r.get("loss") is None:  # a validation record
            continue
        acc.append(r["loss"])
        acc = acc[-window:]
        out[r["step"]] = sum(acc) / len(acc)
    return out


def evals(steps):
    return {r["step"]: r["eval_loss"] for r in steps if r.get("eval_loss") is not None}


def named(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError("%r: write NAME=METRICS.jsonl" % text)
    return name, path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=named, required=True, help="NAME=METRICS.jsonl of the exact run")
    p.add_argument("runs", type=named, nargs="+", help="NAME=METRICS.jsonl of each run compared with it")
    p.add_argument("--bar", type=float, default=0.01, help="largest relative difference of the final "
                   "validation loss (default 0.01)")
    p.add_argument("--spike", type=float, default=0.05, help="relative excess of the smoothed training loss "
                   "over the baseline's that counts as a spike (default 0.05)")
    p.add_argument("--window", type=int, default=20, help="steps of the training-loss smoothing (default 20)")
    p.add_argument("--title", default="Loss curves against the exact run")
    p.add_argument("--out", help="write the Markdown here too")
    args = p.parse_args()

    base_name, base_path = args.baseline
    base_steps, base_summary = read(base_path)
    base_eval, base_train = evals(base_steps), smoothed(base_steps, args.window)
    if not base_eval:
        sys.exit("loss_curves: %s has no validation loss (train with --eval-data and --eval-every)" % base_path)
    last = max(base_eval)
    rows, curves, missed = [], {base_name: base_eval}, []
    rows.append("| %s (baseline) | %.4f | | | | %d | %s |" % (
        base_name, base_eval[last], base_summary.get("skipped_steps", 0),
        "{:,.0f}".format(base_summary.get("tokens_per_s_per_gpu", 0))))
    for name, path in args.runs:
        steps, summary = read(path)
        ev, train = evals(steps), smoothed(steps, args.window)
        common = sorted(set(ev) & set(base_eval))
        if last not in ev:
            sys.exit("loss_curves: %s has no validation loss at step %d, the baseline's last" % (path, last))
        final = ev[last] / base_eval[last] - 1
        largest = max((ev[s] / base_eval[s] - 1 for s in common), key=abs)
        worst = max((train[s] / base_train[s] - 1, s) for s in base_train if s in train and s > args.window)
        spiked = worst[0] > args.spike
        ok = abs(final) <= args.bar and not spiked
        if not ok:
            missed.append(name)
        curves[name] = ev
        rows.append("| %s | %.4f | %+.2f%% | %+.2f%% | %+.2f%% at step %d%s | %d | %s |" % (
            name, ev[last], 100 * final, 100 * largest, 100 * worst[0], worst[1], " (spike)" if spiked else "",
            summary.get("skipped_steps", 0), "{:,.0f}".format(summary.get("tokens_per_s_per_gpu", 0))))

    lines = ["# " + args.title, "",
             "Final validation loss (step %d) and its relative difference from %s's; the largest difference at any "
             "validation point; the largest excess of the training loss (smoothed over %d steps) over %s's at the "
             "same step (a spike above %.0f%%). Bar: final within %.1f%%, no spike." % (
                 last, base_name, args.window, base_name, 100 * args.spike, 100 * args.bar), "",
             "| run | final validation loss | final vs %s | largest at a validation point | largest training excess "
             "| skipped steps | tokens/s/GPU |" % base_name,
             "|---|--:|--:|--:|--:|--:|--:|"] + rows
    lines += ["", "Validation loss at every point:", "",
              "| step | " + " | ".join(curves) + " |", "|--:|" + "--:|" * len(curves)]
    for s in sorted(base_eval):
        lines.append("| %d | " % s + " | ".join("%.4f" % c[s] if s in c else "" for c in curves.values()) + " |")
    lines += ["", "Within the bar: " + ("every run" if not missed else "not " + ", ".join(missed)) + "."]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
