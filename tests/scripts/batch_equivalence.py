"""Equal global batches train equally: ranks x accumulation of 1x4, 2x2 and 4x1 (and 1x4 with a
different micro-batch split) give the same losses and weights up to reduction order."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

STEPS = 12


def train(n, accum, mbs, tag, model="tiny-llama", strategy="FULL"):
    d = t.tmpdir("batch-" + tag)
    t.run(n, ["train", "--model", model, "--seq", "16", "--mbs", str(mbs), "--grad-accum", str(accum),
              "--steps", str(STEPS), "--lr", "2e-3", "--model-precision", "fp32", "--mixed-precision", "no",
              "--strategy", strategy, "--metrics", os.path.join(d, "m.jsonl"), "--ckpt-dir", os.path.join(d, "ckpt")])
    return t.metrics(os.path.join(d, "m.jsonl"))[0], os.path.join(d, "ckpt", "step-%08d.h5" % STEPS)


ref_steps, ref_ckpt = train(1, 4, 2, "1x4")
for n, accum, mbs, strategy in ((2, 2, 2, "FULL"), (4, 1, 2, "FULL"), (1, 2, 4, "FULL"), (2, 2, 2, "NO_SHARD"),
                                (4, 1, 2, "SHARD_GRAD_OP")):
    tag = "%dx%d-mbs%d-%s" % (n, accum, mbs, strategy)
    steps, ckpt = train(n, accum, mbs, tag, strategy=strategy)
    t.compare_losses(steps, ref_steps, 1e-5, "ranks x accumulation %s vs 1x4" % tag)
    t.compare_checkpoints(ckpt, ref_ckpt, 1e-5, "ranks x accumulation %s vs 1x4 final weights" % tag)
t.finish()
