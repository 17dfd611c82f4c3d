"""--resume continues only what the checkpoint was: an older step than the directory's newest is
refused unless --rollback, which moves the newer checkpoints aside (never deletes them); data of
another tokenizer (Llama 2 tokens against a run trained on Llama 3 tokens) is refused unless
--allow-data-change; a config whose fields change the computation (rope_theta, rope_scaling,
rms_norm_eps, attention_dropout, eos/pad token ids; Mistral's sliding_window) is refused unless
--allow-config-change, each
naming the field and both values; checkpoints written before they recorded this resume with a
note. --min-lr above --lr is refused. fsdp verify prints the record, checks it against the
checkpoint's config, and refuses a negative second moment or a non-finite moment even with its
checksum recomputed, naming the tensor and the element; so does --resume."""
import hashlib
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t
import h5py
from tokfixtures import fixtures, read_tokens

FLAGS = ["--seq", "16", "--mbs", "2", "--lr", "2e-3", "--warmup", "2", "--model-precision", "fp32",
         "--mixed-precision", "no", "--device", "cpu"]


def train(d, steps, extra=(), model="tiny-llama", metrics="m.jsonl"):
    # Resumes here go on past the checkpoint's --steps on purpose: the schedule may change (what this
    # test checks is the data, the config and the step; the schedule is newcomer.py's).
    allow = ["--allow-schedule-change"] if "--resume" in extra else []
    return (["train", "--model", model] + FLAGS + ["--steps", str(steps), "--ckpt-dir", os.path.join(d, "ck"),
                                                   "--metrics", os.path.join(d, metrics)] + list(extra) + allow)


def md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def notices(text):
    """The notices but the schedule's (train() accepts a re-spanned schedule; that notice is not this test's)."""
    return [l for l in c.fsdp_lines(text) if l.startswith("fsdp: notice:") and "--allow-schedule-change" not in l]


def trained(d, metrics="m.jsonl"):
    p = os.path.join(d, metrics)
    return [r["step"] for r in t.metrics(p)[0]] if os.path.exists(p) else []


D = t.tmpdir("resume-identity")
ck = os.path.join(D, "ck")
t.run(2, train(D, 4, ["--ckpt-every", "1"]))
ref = t.metrics(os.path.join(D, "m.jsonl"))[0]
step2, step4 = os.path.join(ck, "step-00000002.h5"), os.path.join(ck, "step-00000004.h5")

# ---- item 4: an older step than the directory's newest ------------------------------------------
before = {n: md5(os.path.join(ck, n)) for n in c.step_files(ck)}
rc, out, err = t.run(2, train(D, 6, ["--ckpt-every", "1", "--resume", step2], metrics="m2.jsonl"), check=False)
t.check(rc == 1 and {n: md5(os.path.join(ck, n)) for n in c.step_files(ck)} == before and
        c.latest(ck) == "step-00000004.h5" and not trained(D, "m2.jsonl"),
        "--resume of step 2 with steps 3-4 present: refused, nothing trained, every file as it was")
c.one_error(err, [step2, "step 2", "newer", "step-00000003.h5 to step-00000004.h5", "--rollback"], "an older step")
rc, out, err = t.run(1, train(D, 6, ["--resume", "auto", "--rollback"], metrics="m2.jsonl"), check=False)
t.check(rc == 2, "--rollback with --resume auto is a usage error")
c.one_error(err, ["--rollback", "--resume FILE"], "--rollback needs --resume FILE")

rc, out, err = t.run(2, train(D, 6, ["--ckpt-every", "1", "--resume", step2, "--rollback"], metrics="m2.jsonl"),
                     check=False)
aside = [n for n in os.listdir(ck) if n.startswith("rolled-back-")]
folder = os.path.join(ck, aside[0]) if len(aside) == 1 else ck
t.check(rc == 0 and len(aside) == 1 and "--rollback: moved the 2 checkpoint(s) newer than step 2" in out and
        "%s/" % folder in out, "--rollback moves the newer checkpoints into one folder and says where (%s)" %
        [l for l in out.splitlines() if "rollback" in l])
t.check(sorted(os.listdir(folder)) == ["latest", "step-00000003.h5", "step-00000004.h5"] and
        all(md5(os.path.join(folder, n)) == before[n] for n in ("step-00000003.h5", "step-00000004.h5")) and
        c.latest(folder) == "step-00000004.h5",
        "steps 3 and 4 and the 'latest' that named step 4 are in %s, byte for byte (md5)" % os.path.basename(folder))
steps = t.metrics(os.path.join(D, "m2.jsonl"))[0] if rc == 0 else []
t.check([r["step"] for r in steps] == [3, 4, 5, 6] and [r["loss"] for r in steps[:2]] == [r["loss"] for r in ref[2:]]
        and c.step_files(ck) == ["step-0000000%d.h5" % i for i in (1, 2, 3, 4, 5, 6)] and
        c.latest(ck) == "step-00000006.h5",
        "training continues from step 2 (steps 3-4 as before, bit for bit) to step 6 with 'latest' on it")
rc, out, err = t.run(1, ["verify", folder], check=False)
t.check(rc == 0 and out.count(": ok: ") == 2, "the checkpoints moved aside still verify")

# ---- item 9: --min-lr above --lr -------------------------------------------------------------------
base = ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "2", "--steps", "1", "--device", "cpu"]
rc, out, err = t.run(1, base + ["--lr", "1e-4", "--min-lr", "1e-3"], check=False)
t.check(rc == 2 and "step 1/" not in out, "--min-lr 1e-3 above --lr 1e-4: refused with exit 2")
c.one_error(err, ["--min-lr 0.001", "--lr 0.0001", "climb"], "--min-lr above --lr")
rc, out, err = t.run(1, base + ["--lr", "1e-3", "--min-lr", "1e-3"], check=False)
t.check(rc == 0, "--min-lr equal to --lr is accepted")

# ---- item 6: config fields that change the computation ----------------------------------------------
with h5py.File(step4, "r") as f:
    config = json.loads(f.attrs["config"])
    record = json.loads(f.attrs.get("identity", "{}"))
t.check(record.get("data") == {"source": "synthetic", "vocab_size": 1000} and
        sorted(record.get("config", {})) == ["attention_dropout", "eos_token_id", "pad_token_id", "rms_norm_eps",
                                     "rope_scaling", "rope_theta"],
        "the checkpoint records its data and the config fields that change the computation (%s)" % record)


def model_dir(name, edit):
    d = os.path.join(D, "models", name)
    os.makedirs(d, exist_ok=True)
    cfg = dict(config)
    cfg.update(edit)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    return d


same = model_dir("same", {})
d = t.tmpdir("resume-identity-same")
rc, out, err = t.run(1, train(d, 5, ["--resume", step4], model=same), check=False)
t.check(rc == 0 and trained(d) == [5] and not notices(err),
        "the checkpoint's own config.json resumes without a word (%s)" % notices(err))
for field, value, was, now in (("rope_theta", 500000.0, "100.0", "500000.0"),
                               ("rope_scaling", None, '"rope_type":"llama3"', "null now"),
                               ("rms_norm_eps", 1e-3, "1e-5", "0.001"),
                               ("attention_dropout", 0.1, "0.0", "0.1"),
                               ("eos_token_id", 2, "null", "2"),
                               ("pad_token_id", 0, "null", "0")):
    m = model_dir(field, {field: value})
    d = t.tmpdir("resume-identity-config")
    rc, out, err = t.run(1, train(d, 5, ["--resume", step4], model=m), check=False)
    t.check(rc == 1 and not trained(d) and not c.step_files(os.path.join(d, "ck")),
            "%s %s: refused, nothing trained" % (field, value))
    c.one_error(err, [step4, field, was, now, "--allow-config-change"], "%s changed" % field)
    rc, out, err = t.run(1, train(d, 5, ["--resume", step4, "--allow-config-change"], model=m), check=False)
    t.check(rc == 0 and trained(d) == [5] and len(notices(err)) == 1 and field in notices(err)[0] and
            "--allow-config-change" in notices(err)[0],
            "%s %s with --allow-config-change: trains on, one notice naming it (%s)" % (field, value, notices(err)))
    if field == "rope_theta" and rc == 0:
        with h5py.File(os.path.join(d, "ck", "step-00000005.h5"), "r") as f:
            t.check(json.loads(f.attrs.get("identity", "{}")).get("config", {}).get("rope_theta") == 500000.0,
                    "its checkpoint records the new rope_theta")

# Mistral's sliding_window changes what attention sees without changing a shape: recorded and compared.
dm = t.tmpdir("resume-identity-mistral")
t.run(1, train(dm, 2, model="tiny-mistral"))
mstep = os.path.join(dm, "ck", "step-00000002.h5")
with h5py.File(mstep, "r") as f:
    mconfig = json.loads(f.attrs["config"])
    mrecord = json.loads(f.attrs.get("identity", "{}"))
t.check(mrecord.get("config", {}).get("sliding_window") == 5, "a Mistral checkpoint records its sliding_window (%s)"
        % mrecord.get("config"))
mdir = os.path.join(D, "models", "mistral-window-7")
os.makedirs(mdir, exist_ok=True)
json.dump(dict(mconfig, sliding_window=7), open(os.path.join(mdir, "config.json"), "w"), indent=2)
d = t.tmpdir("resume-identity-window")
rc, out, err = t.run(1, train(d, 3, ["--resume", mstep], model=mdir), check=False)
t.check(rc == 1 and not trained(d), "sliding_window 5 -> 7: refused, nothing trained")
c.one_error(err, [mstep, "sliding_window", "5", "7", "--allow-config-change"], "sliding_window changed")

# ---- old-format checkpoints: no record, a note --------------------------------------------------------
old = os.path.join(D, "old-format.h5")
shutil.copy(step4, old)
with h5py.File(old, "r+") as f:
    for name in ("identity", "identity_checksum"):
        if name in f.attrs:
            del f.attrs[name]
d = t.tmpdir("resume-identity-old")
rc, out, err = t.run(1, train(d, 5, ["--resume", old]), check=False)
t.check(rc == 0 and trained(d) == [5] and len(notices(err)) == 1 and "records no identity" in notices(err)[0],
        "a checkpoint without the record resumes with one note (%s)" % notices(err))
rc, out, err = t.run(1, ["verify", old], check=False)
t.check(rc == 0 and "no record of what trained it" in out, "fsdp verify says it has no record")

# ---- item 5: a token file of another tokenizer ---------------------------------------------------------
fx = fixtures()
text = os.path.join(D, "text.txt")
with open(os.path.join(fx, "brown.txt"), encoding="utf-8") as f:
    open(text, "w", encoding="utf-8").write(f.read(12000).rsplit("\n\n", 1)[0] + "\n")
tokens = {}
for name in ("llama3", "llama2"):
    tokens[name] = os.path.join(D, name + ".bin")
    t.run(1, ["prepare", "--quiet", "--tokenizer", os.path.join(fx, name, "tokenizer.json"), "--input", text,
              "--split-on", "blank-lines", "--out", tokens[name]])
h3, h2 = ("%016x" % read_tokens(tokens[n])["hash"] for n in ("llama3", "llama2"))
# A small Llama with Llama 3's vocabulary, so that both files fit it.
big = model_dir("llama3-vocab", {"vocab_size": 128256, "hidden_size": 16, "intermediate_size": 32,
                                 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                 "bos_token_id": 128000, "eos_token_id": 128001})
d = t.tmpdir("resume-identity-data")
t.run(1, train(d, 2, ["--data", tokens["llama3"]], model=big))
rc, out, err = t.run(1, train(d, 3, ["--data", tokens["llama2"], "--resume", "auto"], model=big, metrics="m2.jsonl"),
                     check=False)
t.check(rc == 1 and not trained(d, "m2.jsonl") and c.step_files(os.path.join(d, "ck")) == ["step-00000002.h5"],
        "Llama 2 tokens against a run trained on Llama 3 tokens: refused, nothing trained")
c.one_error(err, [tokens["llama2"], h3, h2, "128256", "32000", "--allow-data-change", "fine-tune"],
            "another tokenizer")
rc, out, err = t.run(1, train(d, 3, ["--data", tokens["llama2"], "--resume", "auto", "--allow-data-change"],
                              model=big, metrics="m2.jsonl"), check=False)
t.check(rc == 0 and trained(d, "m2.jsonl") == [3] and len(notices(err)) == 1 and
        "--allow-data-change" in notices(err)[0] and "fine-tune" in notices(err)[0] and h2 in notices(err)[0],
        "with --allow-data-change it trains on, saying so (%s)" % notices(err))
rc, out, err = t.run(1, ["verify", os.path.join(d, "ck", "step-00000003.h5")], check=False)
t.check(rc == 0 and "trained on tokens of tokenizer %s (vocabulary 32000)" % h2 in out,
        "fsdp verify prints the new checkpoint's data (%s)" % out.strip()[-300:])

# ---- item 15: optimizer-state invariants, with the checksums recomputed ----------------------------------


def poisoned(name, dataset, index, value):
    path = os.path.join(D, name)
    shutil.copy(step4, path)
    with h5py.File(path, "r+") as f:
        a = f[dataset][()]
        a.reshape(-1)[index] = value
        f[dataset][...] = a
        f[dataset].attrs["checksum"] = c.tensor_checksum(a)
    return path


for path, needles, what in (
        (poisoned("negative-v.h5", "optimizer/exp_avg_sq/model.layers.1.mlp.down_proj.weight", 1234, -1.0),
         ["optimizer/exp_avg_sq/model.layers.1.mlp.down_proj.weight", "negative", "element 1234", "(-1)"],
         "exp_avg_sq holding -1"),
        (poisoned("nan-m.h5", "optimizer/exp_avg/model.norm.weight", 7, float("nan")),
         ["optimizer/exp_avg/model.norm.weight", "non-finite", "element 7"], "exp_avg holding NaN")):
    rc, out, err = t.run(2, ["verify", path], check=False)
    t.check(rc == 1, "%s, checksum recomputed: fsdp verify exits 1" % what)
    c.one_error(err, [path] + needles, what + ": fsdp verify")
    d = t.tmpdir("resume-identity-poison")
    rc, out, err = t.run(1, train(d, 6, ["--resume", path]), check=False)
    t.check(rc == 1 and not trained(d), what + ": --resume refuses it, nothing trained")
    c.one_error(err, [path] + needles, what + ": --resume")

# ---- the record itself: printed, covered by its checksum, checked against the config -----------------
rc, out, err = t.run(1, ["verify", step4], check=False)
t.check(rc == 0 and "trained on synthetic tokens (vocabulary 1000) under rms_norm_eps 1e-5, rope_theta 100.0" in out,
        "fsdp verify prints what trained it (%s)" % out.strip()[-300:])
edited = os.path.join(D, "edited-identity.h5")
shutil.copy(step4, edited)
with h5py.File(edited, "r+") as f:
    r = json.loads(f.attrs.get("identity", '{"config": {}}'))
    r["config"]["rope_theta"] = 500000.0
    f.attrs["identity"] = json.dumps(r)
rc, out, err = t.run(1, ["verify", edited], check=False)
t.check(rc == 1, "an edited record: fsdp verify exits 1")
c.one_error(err, [edited, "'identity'", "identity_checksum"], "an edited record")
with h5py.File(edited, "r+") as f:
    text = f.attrs["identity"].encode() if isinstance(f.attrs["identity"], str) else f.attrs["identity"]
    h = c.bytes_checksum(int(f.attrs["attributes_checksum"]), b"identity=%d:" % len(text))
    f.attrs["identity_checksum"] = __import__("numpy").uint64(c.bytes_checksum(h, text))
rc, out, err = t.run(1, ["verify", edited], check=False)
t.check(rc == 1, "an edited record with its checksum recomputed: fsdp verify exits 1")
c.one_error(err, [edited, "rope_theta 500000.0", "its config says 100.0"], "a record against its config")
t.finish()
