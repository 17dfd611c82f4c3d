"""Broken Hugging Face model directories and bad export requests: one line `fsdp: error: ...` naming the
file (and the tensor where one is at fault), a non-zero exit on every rank before training starts, no
hang, nothing written. The broken files are crafted here from a valid export with the independent
writer (tests/lib/safetensors_np.py) or by editing bytes."""
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import safetensors_np as st

D = t.tmpdir("hf-defects")
TRAIN = ["--seq", "16", "--mbs", "2", "--steps", "1"]


def expect_error(what, nprocs, args, needles, status=None, env=None, preexec=None):
    cmd = ([t.MPIRUN, "-np", str(nprocs)] if nprocs > 1 else []) + [t.BIN] + list(args)
    if args[0] == "train":
        cmd += ["--device", "cpu"]
    try:
        p = subprocess.run(cmd, env=dict(t.ENV, **(env or {})), capture_output=True, text=True, timeout=60,
                           preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        t.fail("%s: timed out (a hang)" % what)
        return ""
    ours = [l for l in p.stderr.splitlines() if l.startswith("fsdp:")]
    crashed = "Segmentation" in p.stderr or "core dumped" in p.stderr
    ok = p.returncode != 0 and len(ours) == 1 and ours[0].startswith("fsdp: error:") and not crashed
    ok = ok and all(n in ours[0] for n in needles) and (status is None or p.returncode == status)
    t.check(ok, "%s -> exit %d, %r" % (what, p.returncode, ours[0] if ours else p.stderr[-400:]))
    return ours[0] if ours else ""


# A valid model: fsdp.c's initial weights of tiny-llama (tied), one file and sharded.
GOOD = os.path.join(D, "good")
t.run(1, ["export", "--model", "tiny-llama", "--out", GOOD, "--dtype", "fp32"])
SHARDED = os.path.join(D, "sharded")
t.run(1, ["export", "--model", "tiny-llama", "--out", SHARDED, "--dtype", "fp32", "--max-shard-size", "150KB"])
TENSORS, META, HEADER, _ = st.read(os.path.join(GOOD, "model.safetensors"))
Q = "model.layers.1.self_attn.q_proj.weight"  # [48, 48]
K, V = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"  # [16, 48] each
UP = "model.layers.1.mlp.up_proj.weight"


def model_dir(name):
    d = os.path.join(D, name)
    os.makedirs(d)
    shutil.copy(os.path.join(GOOD, "config.json"), d)
    return d, os.path.join(d, "model.safetensors")


def variant(name, change):
    """A model directory whose model.safetensors is the good one after change(tensors) (numpy writer)."""
    d, f = model_dir(name)
    tensors = {k: (v[0], list(v[1]), v[2].copy()) for k, v in TENSORS.items()}
    change(tensors)
    st.write(f, tensors, metadata={"format": "pt"})
    return d, f


def raw_variant(name, edit_header, data_edit=None, length=None):
    """A model directory whose header JSON (a dict, or replaced by bytes) and data were edited directly."""
    d, f = model_dir(name)
    with open(os.path.join(GOOD, "model.safetensors"), "rb") as g:
        blob = g.read()
    n = int.from_bytes(blob[:8], "little")
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    text = edit_header(header)  # edits the dict in place, or returns the header's bytes
    if not isinstance(text, bytes):
        text = json.dumps(header).encode()
    if data_edit:
        data = data_edit(data)
    st.write_raw(f, text, data, length=length)
    return d, f


def init_from(what, d, needles, nprocs=2, extra=()):
    ck = os.path.join(D, "ck-" + os.path.basename(d))
    expect_error(what, nprocs, ["train", "--init-from", d, "--ckpt-dir", ck] + TRAIN + list(extra), needles)
    t.check(not os.path.exists(ck), "%s: no checkpoint directory created" % what)


# The good ones load.
for d in (GOOD, SHARDED):
    t.run(2, ["train", "--init-from", d, "--steps", "0"] + TRAIN[:4])

# Tensors against the model.
d, f = variant("missing", lambda ts: ts.pop(UP))
init_from("missing tensor", d, [f, UP, "missing"])
d, f = variant("unexpected", lambda ts: ts.__setitem__("model.layers.7.mlp.extra.weight", ("F32", [4], np.zeros(4, np.float32))))
init_from("unexpected tensor", d, [f, "model.layers.7.mlp.extra.weight", "unexpected"])
d, f = variant("shape", lambda ts: ts.__setitem__(UP, ("F32", [48, 88], ts[UP][2].reshape(48, 88))))
init_from("wrong shape", d, [f, UP, "[48, 88]", "[88, 48]"])
d, f = variant("dtype-i32", lambda ts: ts.__setitem__(Q, ("I32", [48, 48], ts[Q][2].view(np.int32))))
init_from("integer dtype", d, [f, Q, "I32"])
d, f = variant("dtype-f64", lambda ts: ts.__setitem__(Q, ("F64", [48, 48], ts[Q][2].astype(np.float64))))
init_from("F64 dtype", d, [f, Q, "F64"])
d, f = variant("inv-freq", lambda ts: ts.__setitem__("model.layers.0.self_attn.rotary_emb.inv_freq",
                                                     ("F32", [4], np.ones(4, np.float32))))
t.run(2, ["train", "--init-from", d, "--steps", "0"] + TRAIN[:4])
t.check(not t.FAILURES, "rotary_emb.inv_freq buffers of older Llama files are ignored, as transformers does")

# Tied models: an lm_head.weight equal to the embedding is accepted, another is refused.
E = "model.embed_tokens.weight"
d, f = variant("tied-equal", lambda ts: ts.__setitem__("lm_head.weight", ts[E]))
t.run(2, ["train", "--init-from", d, "--steps", "0"] + TRAIN[:4])
t.check(not t.FAILURES, "a tied model's file with lm_head.weight equal to the embedding loads")


def unequal_head(ts):
    head = ts[E][2].copy()
    head[1030, 47] += 1.0
    ts["lm_head.weight"] = ("F32", [1031, 48], head)


d, f = variant("tied-unequal", unequal_head)
init_from("tied lm_head.weight that differs from the embedding", d, [f, "lm_head.weight", "differs", E])

# Framing and header.
d, f = raw_variant("header-too-long", lambda h: None, length=10 ** 6)
init_from("header length past the end of the file", d, [f, "header length 1000000"])
d, f = raw_variant("header-huge", lambda h: None, length=1 << 40)
init_from("header length beyond the format's limit", d, [f, "header length"])
d, f = model_dir("tiny-file")
open(f, "wb").write(b"\x05\0\0")
init_from("file shorter than the length field", d, [f, "too short"])
d, f = raw_variant("not-json", lambda h: b'{"model.embed_tokens.weight": {"dtype": "F32", ')
init_from("header that is not JSON", d, [f, "header", "line 1"])
d, f = raw_variant("array", lambda h: b"[1, 2, 3]")
init_from("header that is not an object", d, [f, "begin with '{'"])
d, f = raw_variant("duplicate", lambda h: json.dumps(h)[:-1].encode() + b', "%s": %s}' % (Q.encode(), json.dumps(h[Q]).encode()))
init_from("header with a tensor twice", d, [f, "duplicate"])
for name, edit, needles in (
        ("dtype-number", lambda h: h[Q].__setitem__("dtype", 7), [Q, "dtype is not a string"]),
        ("dtype-unknown", lambda h: h[Q].__setitem__("dtype", "F17"), [Q, "unknown dtype \"F17\""]),
        ("shape-string", lambda h: h[Q].__setitem__("shape", "48x48"), [Q, "shape is not an array"]),
        ("shape-negative", lambda h: h[Q].__setitem__("shape", [-48, -48]), [Q, "shape entries"]),
        ("shape-real", lambda h: h[Q].__setitem__("shape", [48.0, 48]), [Q, "shape entries"]),
        ("shape-missing", lambda h: h[Q].pop("shape"), [Q, "shape is missing"]),
        ("offsets-one", lambda h: h[Q].__setitem__("data_offsets", [0]), [Q, "data_offsets"]),
        ("offsets-negative", lambda h: h[Q].__setitem__("data_offsets", [-4, 9212]), [Q, "data_offsets"]),
        ("offsets-reversed", lambda h: h[Q].__setitem__("data_offsets", h[Q]["data_offsets"][::-1]), [Q, "end before"]),
        ("entry-not-object", lambda h: h.__setitem__(Q, [1, 2]), [Q, "not an object"]),
        ("metadata-not-strings", lambda h: h.__setitem__("__metadata__", {"format": 1}), ["__metadata__", "format"]),
        ("metadata-not-object", lambda h: h.__setitem__("__metadata__", "pt"), ["__metadata__"]),
        ("size-mismatch", lambda h: h[Q].__setitem__("data_offsets", [h[Q]["data_offsets"][0], h[Q]["data_offsets"][1] - 4]),
         [Q, "need 9216"]),
        ("overlap", lambda h: h[V].__setitem__("data_offsets", h[K]["data_offsets"]), ["overlap"]),
        ("hole", lambda h: h.pop(UP), ["hole"]),
):
    d, f = raw_variant(name, edit)
    init_from("malformed header: " + name, d, [f] + needles, nprocs=1)


def out_of_bounds(h):
    end = max(e["data_offsets"][1] for k, e in h.items() if k != "__metadata__")
    size = h[Q]["data_offsets"][1] - h[Q]["data_offsets"][0]
    h[Q]["data_offsets"] = [end, end + size]


d, f = raw_variant("out-of-bounds", out_of_bounds)
init_from("offsets past the end of the data", d, [f, Q, "past the end"])
d, f = raw_variant("truncated", lambda h: None, data_edit=lambda b: b[:-100])
init_from("truncated file", d, [f, "truncated"])
d, f = raw_variant("trailing", lambda h: None, data_edit=lambda b: b + b"\0" * 12)
init_from("bytes after the last tensor", d, [f, "12 bytes after"])


def gap(h):
    # Every tensor from UP's offset on moves up by 8 bytes: a hole before UP, and the data grows to match.
    at = h[UP]["data_offsets"][0]
    for k, e in h.items():
        if k != "__metadata__" and e["data_offsets"][0] >= at:
            e["data_offsets"] = [e["data_offsets"][0] + 8, e["data_offsets"][1] + 8]


d, f = raw_variant("gap", gap, data_edit=lambda b: b + b"\0" * 8)
init_from("a hole in the data", d, [f, "hole"])

# Not a regular file: a FIFO must be refused at once, not read from forever.
d, f = model_dir("fifo")
os.mkfifo(f)
init_from("a FIFO as model.safetensors", d, [f, "not a regular file"])
d = os.path.join(D, "dev")
os.makedirs(d)
shutil.copy(os.path.join(GOOD, "config.json"), d)
os.symlink("/dev/zero", os.path.join(d, "model.safetensors"))
init_from("a device as model.safetensors", d, ["not a regular file"])

# Sharded models and their index.
INDEX = "model.safetensors.index.json"


def sharded_copy(name):
    d = os.path.join(D, name)
    shutil.copytree(SHARDED, d)
    return d, json.load(open(os.path.join(d, INDEX)))


shards = sorted(f for f in os.listdir(SHARDED) if f.endswith(".safetensors"))
t.check(len(shards) >= 3, "the sharded model has %d files" % len(shards))
d, _ = sharded_copy("index-missing-file")
os.remove(os.path.join(d, shards[-1]))
init_from("index naming a missing file", d, [os.path.join(d, INDEX), shards[-1], "does not exist"])
d, _ = sharded_copy("shard-truncated")
with open(os.path.join(d, shards[1]), "r+b") as g:
    g.truncate(os.path.getsize(os.path.join(d, shards[1])) - 64)
init_from("a truncated shard", d, [os.path.join(d, shards[1]), "truncated"])
d, _ = sharded_copy("in-two-files")
one, _, _, _ = st.read(os.path.join(d, shards[0]))
two, _, _, _ = st.read(os.path.join(d, shards[1]))
extra = sorted(one)[0]
two[extra] = one[extra]
st.write(os.path.join(d, shards[1]), two, metadata={"format": "pt"})
init_from("a tensor in two files", d, [extra, "two files", shards[0], shards[1]])
d, index = sharded_copy("index-escape")
index["weight_map"][sorted(index["weight_map"])[0]] = "../good/model.safetensors"
json.dump(index, open(os.path.join(d, INDEX), "w"))
init_from("index naming a file outside the directory", d, [os.path.join(d, INDEX), "relative name"])
d, index = sharded_copy("index-unlisted")
name = sorted(index["weight_map"])[-1]
del index["weight_map"][name]
json.dump(index, open(os.path.join(d, INDEX), "w"))
init_from("a tensor missing from the index", d, [name, "not in the index"])
d, index = sharded_copy("index-no-map")
json.dump({"metadata": {}}, open(os.path.join(d, INDEX), "w"))
init_from("index without weight_map", d, [os.path.join(d, INDEX), "weight_map"])

# The command line.
expect_error("--init-from with --resume", 2, ["train", "--init-from", GOOD, "--resume", "auto", "--ckpt-dir",
                                              os.path.join(D, "x")] + TRAIN, ["--init-from", "--resume"], status=2)
expect_error("--init-from with another --model", 2, ["train", "--init-from", GOOD, "--model", "tiny-opt"] + TRAIN,
             ["--model tiny-opt", GOOD], status=2)
expect_error("--init-from a directory without config.json", 2, ["train", "--init-from", D] + TRAIN, [D, "config.json"])
expect_error("--init-from a missing path", 2, ["train", "--init-from", os.path.join(D, "nope")] + TRAIN, ["nope"])
expect_error("--init-from a .safetensors file", 1,
             ["train", "--init-from", os.path.join(GOOD, "model.safetensors")] + TRAIN, ["model.safetensors"], status=2)

# Export: an existing model is not overwritten without --force; failures leave nothing under a final name.
ck = os.path.join(D, "ck")
t.run(2, ["train", "--model", "tiny-llama", "--steps", "1", "--ckpt-dir", ck] + TRAIN[:4])
existing = os.path.join(D, "existing")
os.makedirs(existing)
open(os.path.join(existing, "config.json"), "w").write("{}\n")
before = sorted(os.listdir(existing))
expect_error("export into a directory that holds a model", 2, ["export", "--checkpoint", ck, "--out", existing],
             [existing, "config.json", "--force"])
t.check(sorted(os.listdir(existing)) == before and open(os.path.join(existing, "config.json")).read() == "{}\n",
        "the existing model directory is untouched")
t.run(2, ["export", "--checkpoint", SHARDED, "--out", existing, "--force", "--dtype", "fp32", "--max-shard-size", "150KB"])
t.run(2, ["export", "--checkpoint", ck, "--out", existing, "--force"])
t.check(sorted(os.listdir(existing)) == ["config.json", "generation_config.json", "model.safetensors"],
        "--force replaces the model and removes the earlier export's shards and index: %s" % sorted(os.listdir(existing)))
expect_error("export to a path that is a file", 1, ["export", "--checkpoint", ck, "--out", os.path.join(GOOD, "config.json")],
             ["not a directory"])
expect_error("export without --out", 1, ["export", "--checkpoint", ck], ["--out"], status=2)
expect_error("export with both sources", 1, ["export", "--checkpoint", ck, "--model", "tiny-llama", "--out",
                                             os.path.join(D, "both")], ["--checkpoint", "--model"], status=2)
expect_error("export with a bad shard size", 1, ["export", "--checkpoint", ck, "--out", os.path.join(D, "bad"),
                                                 "--max-shard-size", "5 parsecs"], ["5 parsecs"], status=2)
expect_error("export of a directory that is neither", 1, ["export", "--checkpoint", D, "--out", os.path.join(D, "x2")],
             [D, "latest", "config.json"])
expect_error("export of a broken model", 2, ["export", "--checkpoint", os.path.join(D, "truncated"), "--out",
                                             os.path.join(D, "x3")], ["truncated"])
t.check(not os.path.exists(os.path.join(D, "x3")), "a refused export creates no directory")


def final_names(d):
    return [f for f in os.listdir(d) if not f.endswith(".tmp")] if os.path.isdir(d) else []


# A full disk (here: a file-size limit of 16 MB against 76 MB of weights) is found when the files are
# reserved: nothing is left.
def small_files():
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


big = os.path.join(D, "big.json")
json.dump({"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2048,
           "num_hidden_layers": 1, "num_attention_heads": 8, "max_position_embeddings": 256}, open(big, "w"))
out = os.path.join(D, "too-big")
expect_error("export beyond a file-size limit", 1, ["export", "--model", big, "--out", out], ["too-big", "reserve"],
             preexec=small_files)
t.check(not os.path.exists(out), "a failed export leaves no files (and removes the directory it created)")
# A checkpoint that turns out unreadable in the middle (a dataset of another shape): the files were
# created and partly written; they are removed, the directory the export found is left as it was.
import h5py
bad_ck = os.path.join(D, "bad.h5")
shutil.copy(os.path.join(ck, "step-00000001.h5"), bad_ck)
with h5py.File(bad_ck, "r+") as h:
    del h["model.norm.weight"]
    h["model.norm.weight"] = np.ones(47, np.float32)
out = os.path.join(D, "mid-failure")
os.makedirs(out)
expect_error("export of a checkpoint with a wrongly shaped tensor", 2, ["export", "--checkpoint", bad_ck, "--out", out],
             [bad_ck, "model.norm.weight"])
t.check(os.listdir(out) == [], "the failed export removed its temporaries: %s" % os.listdir(out))
# A rank failing in the middle (FSDP_TEST_FAIL counts the pieces a rank has read): no final names.
for spec in ("0:3:exit", "1:3:kill"):
    out = os.path.join(D, "fail-" + spec.replace(":", "-"))
    p = subprocess.run([t.MPIRUN, "-np", "2", t.BIN, "export", "--checkpoint", ck, "--out", out],
                       env=dict(t.ENV, FSDP_TEST_FAIL=spec), capture_output=True, text=True, timeout=60)
    t.check(p.returncode != 0 and final_names(out) == [],
            "export with FSDP_TEST_FAIL=%s: exit %d, nothing under a final name" % (spec, p.returncode))
t.check(not glob.glob(os.path.join(D, "fail-0-3-exit", "*")), "rank 0 failing removes the temporaries too")
t.finish()
