"""safetensors between fsdp.c and an independent reader/writer (tests/lib/safetensors_np.py, numpy only):
- what `fsdp export` writes reads back with numpy: header layout as documented, fp32 bit-identical to
  the checkpoint, bf16 the round-to-nearest-even of it (by the definition, special values included);
- what numpy writes (fp32, bf16, fp16; data in another order, padded header, no __metadata__, names
  without the "model." prefix) imports with `fsdp train --init-from` bit-identically, checked in the
  checkpoint written after a step with learning rate 0."""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import safetensors_np as st

D = t.tmpdir("safetensors-numpy")
UNTIED = os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied", "config.json")
SEQ = ["--seq", "16", "--mbs", "2", "--synthetic-vocab", "900", "--model-precision", "fp32", "--mixed-precision", "no"]


def weights(h5):
    return {k: v for k, v in t.checkpoint_arrays(h5).items() if not k.startswith("optimizer/")}


def same_bits(a, b):
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def imported(tag, model_dir, nprocs=2):
    """Weights fsdp.c holds after --init-from (a step at learning rate 0 leaves them unchanged)."""
    ck = os.path.join(D, "ck-" + tag)
    t.run(nprocs, ["train", "--init-from", model_dir, "--steps", "1", "--lr", "0", "--ckpt-dir", ck] + SEQ)
    path = os.path.join(ck, "step-00000001.h5")
    return weights(path) if os.path.exists(path) else {}


for model in ("tiny-llama", UNTIED, "tiny-opt"):
    label = os.path.basename(os.path.dirname(model)) if model.endswith(".json") else model
    ck = os.path.join(D, "train-" + label)
    t.run(2, ["train", "--model", model, "--steps", "2", "--lr", "1e-2", "--ckpt-dir", ck] + SEQ)
    ref = weights(os.path.join(ck, "step-00000002.h5"))

    # fsdp.c writes, numpy reads.
    out32, out16 = os.path.join(D, label + "-fp32"), os.path.join(D, label + "-bf16")
    t.run(3, ["export", "--checkpoint", ck, "--out", out32, "--dtype", "fp32"])
    t.run(2, ["export", "--checkpoint", ck, "--out", out16, "--dtype", "bf16"])
    got32, meta32, header32, n32 = st.read(os.path.join(out32, "model.safetensors"))
    got16, _, _, _ = st.read(os.path.join(out16, "model.safetensors"))
    keys = list(st.header_of(os.path.join(out32, "model.safetensors"))[0])
    t.check(meta32 == {"format": "pt"} and keys[0] == "__metadata__" and n32 % 8 == 0,
            "%s: header starts with __metadata__ {format: pt}, length a multiple of 8 (%d)" % (label, n32))
    names = keys[1:]
    offsets = [header32[k]["data_offsets"] for k in names]
    t.check(names == sorted(names) and all(offsets[i][1] == offsets[i + 1][0] for i in range(len(offsets) - 1))
            and offsets[0][0] == 0, "%s: tensors in name order, back to back from offset 0" % label)
    t.check(set(got32) == set(ref) and all(same_bits(st.to_f32(got32[k][0], got32[k][2]), ref[k]) for k in ref),
            "%s: fp32 export: %d tensors bit-identical to the checkpoint, read by numpy" % (label, len(ref)))
    t.check(all(got16[k][0] == "BF16" and np.array_equal(got16[k][2].ravel(), st.bf16_nearest_even(ref[k]))
                for k in ref), "%s: bf16 export: every element the round-to-nearest-even of the checkpoint's" % label)
    config = json.load(open(os.path.join(out32, "config.json")))
    t.check(config.get("dtype") == "float32" and config.get("torch_dtype") == "float32" and
            json.load(open(os.path.join(out16, "config.json"))).get("dtype") == "bfloat16",
            "%s: config.json names the weights' dtype (dtype and torch_dtype)" % label)
    tied = "lm_head.weight" not in ref
    t.check(("lm_head.weight" in got32) == (not tied), "%s: lm_head.weight %s" % (label, "absent (tied)" if tied else "present"))

    # numpy writes, fsdp.c reads: fp32, bf16, fp16, data in reverse name order, padded header.
    strip = label == "tiny-opt"   # OPT's published files name the base model's tensors without "model."
    fname = (lambda k: k[len("model."):] if strip and k.startswith("model.") else k)
    for dtype in ("F32", "BF16", "F16"):
        d = os.path.join(D, "np-%s-%s" % (label, dtype))
        os.makedirs(d)
        shutil.copy(os.path.join(out32, "config.json"), d)
        if dtype == "F32":
            enc = {k: v for k, v in ref.items()}
        elif dtype == "BF16":
            enc = {k: st.bf16_nearest_even(v).reshape(v.shape) for k, v in ref.items()}
        else:
            enc = {k: v.astype(np.float16) for k, v in ref.items()}
        tensors = {fname(k): (dtype, list(v.shape), v) for k, v in enc.items()}
        st.write(os.path.join(d, "model.safetensors"), tensors, metadata=None if dtype == "F32" else {"format": "pt"},
                 pad=5)
        want = {k: st.to_f32(dtype, v) for k, v in enc.items()}
        got = imported("%s-%s" % (label, dtype), d)
        t.check(set(got) == set(want) and all(same_bits(got[k], want[k]) for k in want),
                "%s: numpy-written %s file%s imports bit-identically (%d tensors)" %
                (label, dtype, " (names without model.)" if strip else "", len(want)))

# Rounding of special values: numpy writes fp32 with ties, subnormals, the largest float, infinities
# and NaNs; fsdp.c re-exports it as bf16; numpy checks every element by the definition.
base = os.path.join(D, "tiny-llama-fp32")
tensors, _, _, _ = st.read(os.path.join(base, "model.safetensors"))
special = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 2 ** -140, -2 ** -149, 2 ** -126 * 1.5,
                    np.finfo(np.float32).max, -np.finfo(np.float32).max, np.inf, -np.inf, np.nan, 0.0, -0.0,
                    1.00390625, 3.0e38, 1e-45, 65504.0, 0.1], dtype=np.float32)
name = "model.layers.0.self_attn.q_proj.weight"
dtype, shape, arr = tensors[name]
arr = arr.copy().ravel()
arr[:special.size] = special
rng = np.random.default_rng(0)
arr[special.size:] = (rng.standard_normal(arr.size - special.size) * 10.0 ** rng.integers(-30, 30, arr.size - special.size)
                      ).astype(np.float32)
tensors[name] = (dtype, shape, arr.reshape(shape))
src = os.path.join(D, "special-fp32")
os.makedirs(src)
shutil.copy(os.path.join(base, "config.json"), src)
st.write(os.path.join(src, "model.safetensors"), {k: v for k, v in tensors.items()}, metadata={"format": "pt"})
out = os.path.join(D, "special-bf16")
t.run(2, ["export", "--checkpoint", src, "--out", out, "--dtype", "bf16"])
got, _, _, _ = st.read(os.path.join(out, "model.safetensors"))
bits, want = got[name][2].ravel(), st.bf16_nearest_even(arr)
nan = np.isnan(arr)
t.check(np.array_equal(bits[~nan], want[~nan]) and np.all(np.isnan(st.to_f32("BF16", bits[nan]))),
        "bf16 rounding of %d values (ties to even, subnormals, largest float to infinity, signed zeros) matches the "
        "definition; NaN stays NaN" % arr.size)
t.check(same_bits(st.to_f32("F32", st.read(os.path.join(src, "model.safetensors"))[0][name][2]).ravel(), arr),
        "the numpy writer's fp32 file holds the values bit for bit (self-check)")
# The comparison is sensitive: rounding to nearest with ties away from zero differs on the ties.
away = ((arr.view(np.uint32).astype(np.uint64) + 0x8000) >> 16).astype(np.uint16)
t.check(not np.array_equal(away[~nan], want[~nan]), "ties-away rounding would fail the check (it is sensitive)")
t.finish()
