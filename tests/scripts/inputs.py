"""Inputs that must not hang or run away: a FIFO or a device given where a file is expected is refused
at once (--data, --model, --resume, --metrics, --ckpt-dir, fsdp verify); --seq beyond the model's
positions needs --allow-longer-seq; a configuration that cannot fit in host memory is refused before
it allocates, with the figures, which are the memory plan's (plus the checkpoint snapshots); numbers
in flags are decimal."""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t

D = t.tmpdir("inputs")
fifo = os.path.join(D, "fifo")
os.mkfifo(fifo)
fifo_dir = os.path.join(D, "model-dir")
os.makedirs(fifo_dir)
os.mkfifo(os.path.join(fifo_dir, "config.json"))
BASE = ["train"] + c.TINY + ["--steps", "2"]


def refused(what, nprocs, args, needles, status=None, limit=30):
    start = time.time()
    rc, out, err = t.run(nprocs, args, timeout=limit + 30, check=False)
    took = time.time() - start
    t.check(rc != 0 and (status is None or rc == status) and took < limit and "step 1/" not in out,
            "%s: refused in %.1f s, exit %d" % (what, took, rc))
    c.one_error(err, needles, what)


refused("a FIFO as --data", 2, BASE + ["--data", fifo], ["--data", fifo, "is a FIFO, not a regular file"])
refused("a FIFO as --model", 2, BASE[:1] + ["--model", fifo] + BASE[3:], ["--model", fifo, "is a FIFO"])
refused("a FIFO as config.json", 1, BASE[:1] + ["--model", fifo_dir] + BASE[3:], ["config.json", "is a FIFO"])
refused("a FIFO as --resume", 2, BASE + ["--resume", fifo], [fifo, "is a FIFO, not a regular file"])
refused("a FIFO as --metrics", 2, BASE + ["--metrics", fifo], ["--metrics", fifo, "is a FIFO"])
refused("a FIFO as --ckpt-dir", 2, BASE + ["--ckpt-dir", fifo], ["--ckpt-dir", fifo, "is a FIFO, not a directory"])
refused("a character device as --data", 1, BASE + ["--data", "/dev/zero"], ["/dev/zero", "is a character device"])
refused("a FIFO to fsdp verify", 1, ["verify", fifo], [fifo, "is a FIFO"])

# --seq beyond max_position_embeddings (tiny-llama: 256).
refused("--seq 4096 on tiny-llama", 1, ["train", "--model", "tiny-llama", "--seq", "4096", "--steps", "1"],
        ["--seq 4096", "max_position_embeddings 256", "--allow-longer-seq"], status=2)
rc, out, err = t.run(1, ["train", "--model", "tiny-llama", "--seq", "300", "--mbs", "1", "--steps", "1",
                         "--allow-longer-seq", "--device", "cpu"], check=False)
t.check(rc == 0 and "samples of 300 tokens" in out, "--allow-longer-seq trains on longer sequences")
rc, out, err = t.run(1, ["train", "--model", "tiny-llama", "--mbs", "1", "--steps", "1", "--device", "cpu"], check=False)
t.check(rc == 0 and "samples of 256 tokens" in out, "without --seq, the default shrinks to the model's 256")
refused("--seq 4096 on tiny-opt even with --allow-longer-seq", 1,
        ["train", "--model", "tiny-opt", "--seq", "4096", "--allow-longer-seq", "--steps", "1"], ["4096", "positions are learned"])

# Host memory: refused with the figures before allocating (the CPU backend keeps everything there).
refused("llama-2-7b on this host's memory", 2, ["train", "--model", "llama-2-7b", "--steps", "1", "--device", "cpu"],
        ["this run needs at least", "GB of host memory on this node (2 rank(s)", "available"])
refused("a micro-batch of 100000", 1, ["train", "--model", "tiny-llama", "--seq", "256", "--mbs", "100000"],
        ["needs at least", "GB of host memory"])


def host_figures(what, nprocs, strategy, ckpt):
    """The figures of the refusal are the memory plan's (fsdp plan --device cpu, the same defaults):
    each rank's reserved bytes, plus the checkpoint snapshot (master weights and Adam m, v of the
    shard) on every rank that writes checkpoints."""
    ck = os.path.join(D, "never-made")
    args = ["train", "--model", "llama-2-7b", "--steps", "1", "--device", "cpu", "--strategy", strategy]
    rc, out, err = t.run(nprocs, args + (["--ckpt-dir", ck] if ckpt else []), timeout=60, check=False)
    rc2, plan_out, _ = t.run(1, ["plan", "--model", "llama-2-7b", "--gpus", str(nprocs), "--device", "cpu",
                                 "--strategy", strategy, "--json"], check=False)
    m = re.search(r"needs at least ([0-9.]+) GB of host memory on this node \((\d+) rank\(s\); ([0-9.]+) GB of it for "
                  r"checkpoint snapshots, ([0-9.]+) GB for staging the initial weights\)", err)
    if rc == 0 or rc2 != 0 or not m:
        t.fail("%s: refused with the figures (exit %d; plan exit %d): %s" % (what, rc, rc2, err[-600:]))
        return
    b = json.loads(plan_out)["bytes"]
    writers = (1 if strategy == "NO_SHARD" else nprocs) if ckpt else 0
    snapshot = writers * (b["master_weights"] + b["optimizer_states"])
    # Each rank stages one unit's shard of fp32 initial weights at a time: the largest unit is a layer,
    # 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 parameters, sharded over the ranks (FULL) or whole.
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    staging = nprocs * 4 * (layer / nprocs if strategy != "NO_SHARD" else layer)
    need = nprocs * b["reserved"] + snapshot + staging
    said = (float(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4)))
    t.check(abs(said[0] - need / 1e9) < 0.006 and said[1] == nprocs and abs(said[2] - snapshot / 1e9) < 0.006 and
            abs(said[3] - staging / 1e9) < 0.006 and not os.path.exists(ck),
            "%s: %.2f GB (%.2f of it snapshots, %.2f staging) as the plan has it: %d x %.2f GB reserved + %d "
            "snapshot(s) + the largest unit's shard in fp32 per rank; said %s" %
            (what, need / 1e9, snapshot / 1e9, staging / 1e9, nprocs, b["reserved"] / 1e9, writers, said))


host_figures("llama-2-7b, FULL on 2 ranks", 2, "FULL", False)
host_figures("llama-2-7b, FULL on 2 ranks with checkpoints", 2, "FULL", True)
host_figures("llama-2-7b, NO_SHARD on 2 ranks with checkpoints", 2, "NO_SHARD", True)

# Numbers are decimal.
for flag, value in (("--lr", "0x10"), ("--lr", "inf"), ("--lr", " 1e-3"), ("--steps", "0x10"), ("--mbs", "+"),
                    ("--weight-decay", "1e"), ("--seed", "1.5")):
    refused("%s %s" % (flag, value), 1, ["train", flag, value], [flag, value.strip() or value], status=2)
rc, out, err = t.run(1, ["train", "--model", "tiny-llama", "--seq", "16", "--steps", "1", "--device", "cpu", "--lr",
                         "3E-4", "--weight-decay", ".01", "--clip", "+1"], check=False)
t.check(rc == 0, "decimal spellings are accepted (3E-4, .01, +1)")
t.finish()
