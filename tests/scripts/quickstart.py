"""The README's main job, jobs/quickstart.sh, as a user runs it (on 2 CPU ranks, with the built program):
it prepares the Brown corpus with Llama 2's real tokenizer, trains a small Llama from scratch, resumes,
exports and samples. Checked from what it prints and writes:

  - the validation loss at the end is below the unigram baseline it printed by a clear margin, and the
    baseline is the unigram cross-entropy computed here, independently, from the two token files;
  - the training run started from the initial-weights checkpoint (step 0) and the resumed run from the
    last checkpoint of the first (step STEPS), and ran to STEPS + MORE_STEPS, every step in the metrics once;
  - the samples before and after training are there and differ;
  - the export holds config.json, model.safetensors and tokenizer.json, and fsdp eval --init-from it
    (the path fsdp train --init-from loads too) gives the run's last validation loss;
  - every path of the closing summary exists."""
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

STEPS, MORE = 200, 40  # the job's defaults
MARGIN = 0.5  # nats per token below the unigram baseline
out = t.tmpdir("quickstart")
env = dict(t.ENV, FSDP_BIN=t.BIN, OUT=out, DEVICE="cpu")
start = time.time()
p = subprocess.run(["bash", os.path.join(t.ROOT, "jobs", "quickstart.sh")], env=env, capture_output=True, text=True,
                   timeout=1100)
wall = time.time() - start
print(p.stdout[-2500:])
if p.returncode != 0:
    t.fail("jobs/quickstart.sh exited %d after %.0f s:\n%s" % (p.returncode, wall, p.stderr[-3000:]))
    t.finish()
print("ok: jobs/quickstart.sh finished in %.0f s here" % wall)

summary = re.search(r"validation loss \(nats/token\): unigram baseline ([0-9.]+) \| step (\d+) ([0-9.]+) \| "
                    r"step (\d+) ([0-9.]+)", p.stdout)
t.check(summary is not None, "it prints the unigram baseline and the validation losses")
if not summary:
    t.finish()
baseline, trained, resumed = float(summary.group(1)), float(summary.group(3)), float(summary.group(5))
t.check(int(summary.group(2)) == STEPS and int(summary.group(4)) == STEPS + MORE, "at steps %d and %d" %
        (STEPS, STEPS + MORE))
t.check(resumed < baseline - MARGIN and trained < baseline - MARGIN,
        "the validation loss (%.4f at step %d, %.4f at %d) is below the unigram baseline %.4f by more than %.1f nats" %
        (trained, STEPS, resumed, STEPS + MORE, baseline, MARGIN))


# ---- the unigram baseline, independently: the stream of each file (documents joined by EOS = 2, as
# --packing stream joins them) and its targets (every token but the first; training: whole windows of 128)
def stream(path):
    with open(path, "rb") as f:
        raw = f.read()
    version, width, n = struct.unpack_from("<IIQ", raw, 8)
    docs = struct.unpack_from("<Q", raw, 32)[0]
    t.check(version == 2, "%s is a token file of version 2" % os.path.basename(path))
    tokens = struct.unpack_from("<%d%s" % (n, "H" if width == 2 else "I"), raw, 64)
    starts = struct.unpack_from("<%dQ" % (docs + 1), raw, 64 + n * width)
    s = []
    for d in range(docs):
        s.extend(tokens[starts[d]:starts[d + 1]])
        if starts[d + 1] > starts[d] and tokens[starts[d + 1] - 1] != 2 and (d + 1 == docs or tokens[starts[d + 1]] != 2):
            s.append(2)
    return s


data = os.path.join(out, "data")
train = stream(os.path.join(data, "brown.bin"))
val = stream(os.path.join(data, "brown.val.bin"))
windows = (len(train) - 1) // 128
counts = Counter(train[1:1 + windows * 128])
total, vocab = sum(counts.values()), 32000
mine = sum(math.log(total + vocab) - math.log(counts[x] + 1) for x in val[1:]) / (len(val) - 1)
t.check(abs(mine - baseline) < 1e-3, "the printed baseline %.4f is the unigram cross-entropy of the validation "
        "tokens under the training tokens' add-one frequencies (%.4f, computed here)" % (baseline, mine))

# ---- checkpoints and the resume
with open(os.path.join(out, "train.log")) as f:
    train_log = f.read()
with open(os.path.join(out, "resume.log")) as f:
    resume_log = f.read()
t.check(re.search(r"resumed from \S*/step-00000000\.h5 at step 0 ", train_log) is not None,
        "the training run started from the initial weights (step 0 checkpoint)")
t.check(re.search(r"resumed from \S*/step-%08d\.h5 at step %d " % (STEPS, STEPS), resume_log) is not None,
        "the resumed run continued from the checkpoint of step %d" % STEPS)
t.check(re.search(r"^step %d/%d \|" % (STEPS + MORE, STEPS + MORE), resume_log, re.M) is not None,
        "and trained to step %d" % (STEPS + MORE))
steps, summary_rec = t.metrics(os.path.join(out, "metrics.jsonl"))
trained_steps = [r["step"] for r in steps if "loss" in r]
t.check(trained_steps == list(range(1, STEPS + MORE + 1)), "the metrics hold every step once (%d records)" %
        len(trained_steps))
evals = [r for r in steps if "eval_loss" in r]
t.check(evals and evals[-1]["step"] == STEPS + MORE and abs(evals[-1]["eval_loss"] - resumed) < 1e-3,
        "the metrics' last eval_loss is the printed one")
ckpts = sorted(f for f in os.listdir(os.path.join(out, "ckpt")) if f.startswith("step-"))
t.check(ckpts == ["step-%08d.h5" % s for s in sorted(set(range(0, STEPS + MORE + 1, 50)) | {STEPS, STEPS + MORE})],
        "checkpoints every 50 steps from the initial weights, and at steps %d and %d (%s)" % (STEPS, STEPS + MORE, ckpts))

# ---- samples
samples = {}
for name in ("before", "after"):
    with open(os.path.join(out, "samples", name + ".txt"), encoding="utf-8") as f:
        samples[name] = f.read().strip()
t.check(all(s.startswith("The jury said that") and len(s) > len("The jury said that") + 20 for s in samples.values())
        and samples["before"] != samples["after"], "samples before and after training, different: %r / %r" %
        (samples["before"][:80], samples["after"][:80]))
t.check("before training: " + samples["before"].splitlines()[0] in p.stdout and
        "after training:  " + samples["after"].splitlines()[0] in p.stdout, "both printed")

# ---- the export: a Hugging Face directory that fsdp loads as a pretrained model
export = os.path.join(out, "export")
t.check(all(os.path.isfile(os.path.join(export, f)) for f in ("config.json", "model.safetensors", "tokenizer.json",
                                                              "generation_config.json")),
        "the export holds config.json, generation_config.json, model.safetensors and tokenizer.json")
with open(os.path.join(export, "config.json")) as f:
    cfg = json.load(f)
t.check(cfg.get("vocab_size") == 32000 and cfg.get("model_type") == "llama", "a Llama with Llama 2's vocabulary")
rc, ev_out, _ = t.run(2, ["eval", "--init-from", export, "--data", os.path.join(data, "brown.val.bin"), "--seq", "128",
                          "--mixed-precision", "no", "--device", "cpu"], timeout=300)
m = re.search(r"eval loss ([0-9.]+)", ev_out)
# The export is bf16, training's master weights fp32: a small difference.
t.check(m and abs(float(m.group(1)) - resumed) < 0.05, "fsdp eval --init-from the export: %s vs %.4f at the end of "
        "training" % (m and m.group(1), resumed))

# ---- where everything is
for line in p.stdout[p.stdout.rindex("== done in"):].splitlines():
    if re.match(r"^(data|model|checkpoints|logs|samples|export): ", line):
        for path in re.findall(r"(/\S+?)[,;)]?(?=\s|$)", line):
            t.check(os.path.exists(path), "the summary's %s exists" % path)
t.finish()
