"""Checkpoint at step 10 and resume: steps 11-20 are bit-identical to an uninterrupted run on the same
layout, and agree within 1e-5 when resumed on another number of ranks and strategy. The file is
readable with h5py under Hugging Face names and shapes; --keep and the 'latest' pointer work."""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]


def train(n, mbs, tag, extra, model="tiny-llama"):
    d = t.tmpdir("resume-" + tag)
    args = ["train", "--model", model, "--seq", "16", "--mbs", str(mbs), "--steps", "20", "--lr", "2e-3",
            "--warmup", "2", "--weight-decay", "0.05", "--metrics", os.path.join(d, "m.jsonl"),
            "--ckpt-dir", os.path.join(d, "ckpt")] + extra
    t.run(n, args)
    return d, t.metrics(os.path.join(d, "m.jsonl"))[0]


full_runs = {}
for model, precision in (("tiny-llama", FP32), ("tiny-opt", FP32), ("tiny-llama", [])):
    label = model + (" fp32" if precision else " bf16-mixed")
    tag = model + ("-fp32" if precision else "-mixed")
    full_dir, full = train(2, 6, tag + "-full", precision + ["--ckpt-every", "10"], model)
    full_runs[tag] = full_dir
    ck10 = os.path.join(full_dir, "ckpt", "step-00000010.h5")
    ck20 = os.path.join(full_dir, "ckpt", "step-00000020.h5")
    t.check(os.path.exists(ck10) and os.path.exists(ck20), label + ": checkpoints at steps 10 and 20 written")

    # Same layout: bit for bit.
    same_dir, same = train(2, 6, tag + "-same", precision + ["--resume", ck10], model)
    t.check([r["step"] for r in same] == list(range(11, 21)), label + ": resumed run covers steps 11-20")
    t.check([r["loss"] for r in same] == [r["loss"] for r in full[10:]] and
            [r["grad_norm"] for r in same] == [r["grad_norm"] for r in full[10:]],
            label + ": same layout: losses and grad norms of steps 11-20 identical")
    t.compare_checkpoints(os.path.join(same_dir, "ckpt", "step-00000020.h5"), ck20, 0, label + ": same layout final",
                          exact=True)

    # Other layouts, same global batch of 12: within 1e-5.
    if precision:
        for n, mbs, strategy, rpn in ((3, 4, "SHARD_GRAD_OP", 0), (4, 3, "HYBRID", 2), (1, 12, "NO_SHARD", 0)):
            extra = precision + ["--resume", ck10, "--strategy", strategy] + (["--ranks-per-node", str(rpn)] if rpn else [])
            other_dir, other = train(n, mbs, "%s-%d-%s" % (tag, n, strategy), extra, model)
            what = "%s: resumed on %d rank(s) %s" % (label, n, strategy)
            t.compare_losses(other, full[10:], 1e-5, what)
            t.compare_checkpoints(os.path.join(other_dir, "ckpt", "step-00000020.h5"), ck20, 1e-5, what + " final",
                                  skip="k_proj.bias" if model == "tiny-opt" else None)

# --resume auto on a finished run has nothing to do; on an empty directory it starts fresh.
rc, out, err = t.run(2, ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "6", "--steps", "20",
                         "--ckpt-dir", os.path.join(full_runs["tiny-llama-fp32"], "ckpt"),
                         "--resume", "auto"] + FP32)
t.check(rc == 0 and "nothing to do" in out, "--resume auto on a finished run does nothing")
fresh = t.tmpdir("resume-fresh")
rc, out, err = t.run(1, ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "2", "--steps", "2",
                         "--ckpt-dir", os.path.join(fresh, "ckpt"), "--resume", "auto"])
t.check(rc == 0 and "starting from step 0" in out, "--resume auto on an empty directory starts fresh")

# --steps 0 on a fresh run saves the initial weights as step 0; training on from them is the fresh run.
init = t.tmpdir("resume-init")
rc, out, err = t.run(2, ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "6", "--steps", "0",
                         "--ckpt-dir", os.path.join(init, "ckpt")] + FP32)
t.check(rc == 0 and "the initial weights are checkpoint" in out and
        os.path.exists(os.path.join(init, "ckpt", "step-00000000.h5")), "--steps 0 writes the initial weights (step 0)")
def tensor_gb(path):
    """The bytes of every dataset of a checkpoint (all float32), in GB."""
    import h5py
    sizes = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: sizes.append(obj.size * 4) if isinstance(obj, h5py.Dataset) else None)
    return sum(sizes) / 1e9


# FSDP_VERBOSE_CKPT=1: each rank says how much it moved and where its threads' time went; the
# ranks' bytes add up to the file's tensor bytes, and no thread is busier than the wall time allows.
verbose = t.tmpdir("resume-verbose-ckpt")
t.ENV["FSDP_VERBOSE_CKPT"] = "1"
try:
    rc, out, err = t.run(2, ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "6", "--steps", "0",
                             "--ckpt-dir", os.path.join(verbose, "ckpt")] + FP32)
    rc2, out2, err2 = t.run(2, ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "6", "--steps", "1",
                                "--ckpt-dir", os.path.join(verbose, "ckpt"), "--resume", "auto"] + FP32,
                            check=False)
finally:
    del t.ENV["FSDP_VERBOSE_CKPT"]
line = re.compile(r"^checkpoint I/O on rank (\d): (wrote|read) ([0-9.]+) (MB|GB) in ([0-9.]+) s \([0-9.]+ GB/s\) on (\d+) "
                  r"threads \((O_DIRECT|page cache)\); thread-seconds: ([0-9.]+) in (pwrite|pread), ([0-9.]+) converting, "
                  r"hashing and copying(; the final fsync ([0-9.]+) s)?$", re.M)
for what, text in (("wrote", out), ("read", out2)):
    found = [m for m in line.finditer(text) if m.group(2) == what]
    ranks = sorted(int(m.group(1)) for m in found)
    t.check(ranks == [0, 1], "FSDP_VERBOSE_CKPT=1: a '%s' line from each rank (%s)" % (what, ranks))
    expected = tensor_gb(os.path.join(verbose, "ckpt", "step-00000000.h5"))
    moved = sum(float(m.group(3)) * (1e-3 if m.group(4) == "MB" else 1) for m in found)
    t.check(abs(moved - expected) <= 0.01 * expected,
            "FSDP_VERBOSE_CKPT=1: the ranks %s %.6f GB, the file's tensors hold %.6f GB" % (what, moved, expected))
    busy = [(float(m.group(8)) + float(m.group(10)), int(m.group(6)) * float(m.group(5))) for m in found]
    t.check(all(b <= cap * 1.05 + 0.005 for b, cap in busy),
            "FSDP_VERBOSE_CKPT=1: thread-seconds within threads x wall time (%s)" % busy)
t.check(rc2 == 0, "the verbose resume trains (%s)" % err2.strip().splitlines()[-1:])

init_dir, from_init = train(2, 6, "from-init", FP32 + ["--resume", os.path.join(init, "ckpt", "step-00000000.h5"),
                                                       "--ckpt-every", "10"])
t.check([r["loss"] for r in from_init] == [r["loss"] for r in t.metrics(os.path.join(full_runs["tiny-llama-fp32"],
                                                                                     "m.jsonl"))[0]],
        "training on from the step 0 checkpoint gives the fresh run's losses, bit for bit")
t.compare_checkpoints(os.path.join(init_dir, "ckpt", "step-00000020.h5"),
                      os.path.join(full_runs["tiny-llama-fp32"], "ckpt", "step-00000020.h5"), 0,
                      "from the step 0 checkpoint: final", exact=True)

# h5py sees Hugging Face names, shapes and the documented attributes.
import h5py
with h5py.File(os.path.join(full_runs["tiny-llama-fp32"], "ckpt", "step-00000010.h5"), "r") as f:
    t.check(f["model.embed_tokens.weight"].shape == (1031, 48) and
            f["model.layers.0.self_attn.q_proj.weight"].shape == (48, 48) and
            f["model.layers.0.self_attn.k_proj.weight"].shape == (16, 48) and
            f["model.layers.1.mlp.down_proj.weight"].shape == (48, 88) and
            f["model.norm.weight"].shape == (48,) and "lm_head.weight" not in f,
            "h5py: Hugging Face names and shapes (tied: no lm_head.weight)")
    t.check(f["optimizer/exp_avg/model.layers.0.mlp.gate_proj.weight"].shape == (88, 48) and
            f["optimizer/exp_avg_sq/model.norm.weight"].shape == (48,), "h5py: Adam moments under the same names")
    a = f.attrs
    cfg = json.loads(a["config"])
    t.check(int(a["step"]) == 10 and int(a["samples_seen"]) == 120 and cfg["model_type"] == "llama" and
            cfg["num_key_value_heads"] == 2 and a["format"] == "fsdp.c checkpoint" and
            json.loads(a["run"])["mbs"] == 6 and json.loads(a["schedule"])["type"] == "warmup_cosine",
            "h5py: attributes step, samples_seen, config, run, schedule")

# --keep 2 leaves the two newest checkpoints and 'latest' points at the last.
kd, _ = train(1, 2, "keep", ["--ckpt-every", "5", "--keep", "2"])
files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(kd, "ckpt", "*")))
t.check(files == ["latest", "step-00000015.h5", "step-00000020.h5"], "--keep 2 leaves %s" % files)
t.check(open(os.path.join(kd, "ckpt", "latest")).read().strip() == "step-00000020.h5", "latest names step 20")
t.finish()
