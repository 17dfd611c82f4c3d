"""A damaged or edited checkpoint is never trained on: every tensor's checksum (recomputed here with
numpy from the algorithm in docs/FORMATS.md) and the attributes' checksum are stored in the file;
a flipped byte in a tensor, and every attribute edited out of range or against the others, is refused
by --resume and by fsdp verify with one line naming the file and the tensor or attribute, before any
step runs. fsdp verify says what a good file and directory hold."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t
import h5py
import numpy as np

D = t.tmpdir("ckpt-integrity")
t.run(2, c.train(D, 4, ["--ckpt-every", "2"]))
ck = os.path.join(D, "ck")
good = os.path.join(ck, "step-00000004.h5")

# The stored checksums are the documented algorithm's, for every dataset and the attributes.
with h5py.File(good, "r") as f:
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    wrong = [n for n in names if int(f[n].attrs["checksum"]) != c.tensor_checksum(f[n][()])]
    t.check(len(names) == 60 and not wrong, "%d datasets, each checksum equals numpy's (mismatches: %s)" % (len(names), wrong[:3]))
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    t.check(int(f.attrs["attributes_checksum"]) == c.attributes_checksum(attrs) and
            f.attrs["checksum_algorithm"] == "sum64-fmix64" and int(f.attrs["format_version"]) == 2,
            "attributes_checksum equals the documented hash of the root attributes")
    # The checksum sees a single flipped bit (the comparison is sensitive).
    a = f["model.norm.weight"][()]
    b = a.copy()
    b.view(np.uint32)[5] ^= 1
    t.check(c.tensor_checksum(a) != c.tensor_checksum(b), "one flipped bit changes a tensor's checksum")


def refused(path, needles, what):
    """--resume PATH and fsdp verify PATH both refuse it, naming the file and the culprit; nothing is trained."""
    d = t.tmpdir("ckpt-integrity-run")
    rc, out, err = t.run(1, c.train(d, 6, ["--resume", path]), check=False)
    c.one_error(err, [path] + needles, what + ": --resume")
    t.check(rc != 0 and "step 5/" not in out and not os.path.exists(os.path.join(d, "m.jsonl")) and
            not c.step_files(os.path.join(d, "ck")), what + ": nothing trained, nothing written")
    rc, out, err = t.run(1, ["verify", path], check=False)
    t.check(rc == 1, what + ": fsdp verify exits 1")
    c.one_error(err, [path] + needles, what + ": fsdp verify")


def damaged(name):
    path = os.path.join(D, name)
    shutil.copy(good, path)
    return path


# Flipped bytes inside tensors (a weight, an Adam moment).
p = damaged("flipped-weight.h5")
c.flip_byte(p, "model.layers.1.mlp.up_proj.weight", 1000)
refused(p, ["model.layers.1.mlp.up_proj.weight", "does not match its checksum"], "a flipped byte in a weight")
p = damaged("flipped-moment.h5")
c.flip_byte(p, "optimizer/exp_avg_sq/model.embed_tokens.weight", 77)
refused(p, ["optimizer/exp_avg_sq/model.embed_tokens.weight", "does not match its checksum"], "a flipped byte in a moment")

# Edited attributes: out of range, against each other, against the schedule, or just changed.
schedule = json.loads(attrs["schedule"])
del schedule["warmup"]
for attr, value, needles in (
        ("step", np.int64(-5), ["attribute 'step' is -5"]),
        ("step", np.int64(1 << 62), ["attribute 'step' is 4611686018427387904"]),
        ("samples_seen", np.int64(-100), ["attribute 'samples_seen' is -100"]),
        ("samples_seen", np.int64(2), ["'step' (4) and 'samples_seen' (2) disagree"]),
        ("step", np.int64(3), ["attributes_checksum"]),
        ("step", np.int64(5), ["beyond the schedule's total_steps (4)"]),
        ("schedule", json.dumps(schedule), ["attribute 'schedule' lacks", "warmup"]),
        ("config", "{not json", ["attribute 'config' is not a JSON object"]),
        ("format_version", np.int64(9), ["format version 9"])):
    p = damaged("edited-%s-%s.h5" % (attr, str(value)[:12].replace("/", "").replace(" ", "")))
    c.set_attr(p, attr, value)
    refused(p, needles, "attribute %s set to %s" % (attr, str(value)[:40]))

# Files other writers produced: a format-1 file (before checksums) still resumes, with a notice;
# a copy with chunked, compressed datasets (no plain offsets: read through HDF5) resumes and is
# verified the same way; the same copy damaged is refused.
base = t.tmpdir("ckpt-integrity-base")
t.run(1, c.train(base, 6, ["--resume", good]))
base_steps = t.metrics(os.path.join(base, "m.jsonl"))[0]
v1 = damaged("format1.h5")
with h5py.File(v1, "r+") as f:
    for n in names:
        del f[n].attrs["checksum"]
    del f.attrs["checksum_algorithm"], f.attrs["attributes_checksum"]
    f.attrs["format_version"] = np.int64(1)
chunked = os.path.join(D, "chunked.h5")
with h5py.File(good, "r") as src, h5py.File(chunked, "w") as dst:
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    for n in names:
        d = dst.create_dataset(n, data=src[n][()], chunks=True, compression="gzip")
        d.attrs["checksum"] = src[n].attrs["checksum"]
for path, tag, notice in ((v1, "a format-1 file", "format version 1"), (chunked, "a chunked, compressed copy", None)):
    d = t.tmpdir("ckpt-integrity-run")
    rc, out, err = t.run(1, c.train(d, 6, ["--resume", path]), check=False)
    steps = t.metrics(os.path.join(d, "m.jsonl"))[0] if rc == 0 else []
    t.check(rc == 0 and [r["loss"] for r in steps] == [r["loss"] for r in base_steps] and
            (notice is None or notice in err), "%s resumes like the original (%s)" % (tag, err.strip()[-200:]))
rc, out, err = t.run(1, ["verify", v1], check=False)
t.check(rc == 0 and "format version 1: no checksums" in out, "fsdp verify reads a format-1 file and says it cannot verify it")
with h5py.File(chunked, "r+") as f:
    a = f["model.layers.0.mlp.down_proj.weight"][()]
    a.view(np.uint32)[7, 7] ^= 1
    f["model.layers.0.mlp.down_proj.weight"][...] = a
refused(chunked, ["model.layers.0.mlp.down_proj.weight", "does not match its checksum"], "a damaged chunked copy")

# A good file and a directory: what they hold, exit 0.
rc, out, err = t.run(2, ["verify", good], check=False)
t.check(rc == 0 and "%s: ok: llama" % good in out and "step 4, 16 samples seen" in out and
        "written by 2 rank(s) with FULL" in out and "every checksum matches" in out,
        "fsdp verify FILE on 2 ranks: ok, model, step, layout (%s)" % (out.strip() or err.strip())[-300:])
rc, out, err = t.run(1, ["verify", ck], check=False)
t.check(rc == 0 and out.count(": ok: ") == 2 and "%s/latest: step-00000004.h5" % ck in out,
        "fsdp verify DIR: both step files and the latest pointer (%s)" % (out + err)[-400:])
os.makedirs(os.path.join(D, "mixed"))
shutil.copy(good, os.path.join(D, "mixed", "step-00000004.h5"))
shutil.copy(os.path.join(D, "flipped-weight.h5"), os.path.join(D, "mixed", "step-00000006.h5"))
open(os.path.join(D, "mixed", "latest"), "w").write("step-00000006.h5\n")
rc, out, err = t.run(1, ["verify", os.path.join(D, "mixed")], check=False)
t.check(rc == 1 and out.count(": ok: ") == 1 and "step-00000006.h5: tensor model.layers.1.mlp.up_proj.weight" in err
        and "latest names step-00000006.h5, which does not verify" in err,
        "fsdp verify DIR with one damaged file: exit 1, the file, the tensor and the pointer named")
t.finish()
