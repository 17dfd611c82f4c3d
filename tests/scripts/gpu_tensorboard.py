"""fsdp train --tensorboard on the GPU, read by TensorBoard itself: tensorboard's EventAccumulator loads
the folder and its scalars (train/loss, train/lr, train/grad_norm, train/tokens_per_s_per_gpu,
train/mfu, train/reserved_gib, eval/loss, eval/ppl, summary/*) equal the --metrics JSON Lines of the
same run, step by step (float32's rounding of the JSON's 10 digits); a resumed run's second file is read
as the same run, continuing. SKIPPED without a GPU and the CUDA backend, or without tensorboard."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing

if t.has_cuda_backend() < 1:
    print("gpu_tensorboard: SKIPPED (needs a GPU and fsdp.c's CUDA backend)")
    sys.exit(77)
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print("gpu_tensorboard: SKIPPED (%s: no tensorboard for %s)" % (e, sys.executable))
    sys.exit(77)

D = t.tmpdir("gpu_tensorboard")
rng = random.Random(3)
VOCAB = 990
docs = [[2] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(20, 200))] for _ in range(300)]
train_file, val_file = os.path.join(D, "train.bin"), os.path.join(D, "val.bin")
packing.write_v2(train_file, docs[:260], VOCAB)
packing.write_v2(val_file, docs[260:], VOCAB)
tb, m, ckpt = os.path.join(D, "tb"), os.path.join(D, "m.jsonl"), os.path.join(D, "ckpt")
COMMON = ["train", "--model", "tiny-llama", "--data", train_file, "--eval-data", val_file, "--eval-every", "5",
          "--seq", "64", "--mbs", "4", "--lr", "3e-3", "--warmup", "2", "--metrics", m, "--tensorboard", tb,
          "--ckpt-dir", ckpt, "--ckpt-every", "5"]
t.run(1, COMMON + ["--steps", "10"], device="cuda")
t.run(1, COMMON + ["--steps", "15", "--resume", "auto", "--allow-schedule-change"], device="cuda")

acc = EventAccumulator(tb, size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
want = {}
for r in (json.loads(l) for l in open(m)):
    prefix = "summary" if r.get("summary") is True else "eval" if "eval_loss" in r else "train"
    step = r["final_step" if prefix == "summary" else "step"]
    for k, v in r.items():
        if k in ("step", "final_step") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        name = k[5:] if prefix == "eval" and k.startswith("eval_") else k
        want.setdefault("%s/%s" % (prefix, name), {})[step] = float(v)
for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s_per_gpu", "train/mfu",
            "train/reserved_gib", "eval/loss", "eval/ppl", "summary/tokens_per_s_per_gpu", "summary/mfu"):
    t.check(tag in tags, "EventAccumulator lists %s" % tag)
bad = []
for tag, steps in want.items():
    got = {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
    for step, v in steps.items():
        if step not in got or abs(got[step] - v) > abs(v) * (2.0 ** -24 + 1e-9) + 1e-30:
            bad.append((tag, step, v, got.get(step)))
t.check(not bad, "every scalar EventAccumulator reads equals the metrics JSON Lines (%d tags): %s" % (len(want), bad[:5]))
t.check(sorted(e.step for e in acc.Scalars("train/loss")) == list(range(1, 16)),
        "train/loss at steps 1 to 15 over the two files (the resumed run continues the same run)")
t.finish()
