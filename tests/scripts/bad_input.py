"""Bad input gets one line naming the problem (and the file), a non-zero exit, no crash, no hang, and
nothing half-written: unknown flag/command/model/strategy, malformed config.json, bad token files,
missing/truncated/foreign checkpoints, a checkpoint of another model; config.json fields that change
the computation are honoured (OPT's enable_bias false trains without biases) or refused."""
import glob
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

D = t.tmpdir("bad-input")
BASE = ["train", "--seq", "16", "--mbs", "2", "--steps", "2"]


def expect_error(what, nprocs, args, needles, status=None):
    rc, out, err = t.run(nprocs, args, timeout=120, check=False)
    ours = [l for l in err.splitlines() if l.startswith("fsdp:")]
    crashed = "Segmentation" in err or "core dumped" in err or "signal" in err.lower()
    ok = rc != 0 and len(ours) == 1 and ours[0].startswith("fsdp: error:") and not crashed
    ok = ok and all(n in ours[0] for n in needles) and (status is None or rc == status)
    t.check(ok, "%s -> exit %d, %r" % (what, rc, ours[0] if ours else err[-300:]))


def token_file(path, tokens, vocab, width=2, magic=b"FSDPTOK\0", version=1, count=None):
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<IIQQ", version, width, len(tokens) if count is None else count, vocab))
        f.write(b"\0" * 32)
        f.write(struct.pack("<%d%s" % (len(tokens), "H" if width == 2 else "I"), *tokens))


# Command line.
expect_error("unknown flag", 2, BASE + ["--bogus", "1"], ["--bogus"], status=2)
expect_error("flag without value", 1, ["train", "--mbs"], ["--mbs"], status=2)
expect_error("non-numeric value", 1, ["train", "--mbs", "four"], ["--mbs", "four"], status=2)
expect_error("unknown command", 1, ["frobnicate"], ["frobnicate"], status=2)
expect_error("unknown model", 2, BASE + ["--model", "no-such-model"], ["no-such-model"])
expect_error("unknown strategy", 2, BASE + ["--strategy", "ZERO9"], ["ZERO9"], status=2)
expect_error("bad precision", 1, BASE + ["--mixed-precision", "fp8"], ["fp8"], status=2)
expect_error("ranks-per-node not dividing", 3, BASE + ["--strategy", "HYBRID", "--ranks-per-node", "2"],
             ["--ranks-per-node"])
expect_error("OPT sequence beyond its positions", 1, ["train", "--model", "tiny-opt", "--seq", "4096"], ["4096"])

# config.json.
bad_json = os.path.join(D, "broken", "config.json")
os.makedirs(os.path.dirname(bad_json))
open(bad_json, "w").write('{"model_type": "llama", "hidden_size": 64,\n "num_hidden_layers": }\n')
expect_error("malformed config.json", 2, BASE + ["--model", bad_json], [bad_json, "line 2"])
gpt2 = os.path.join(D, "gpt2.json")
open(gpt2, "w").write('{"model_type": "gpt2", "n_embd": 64}')
expect_error("unsupported model_type", 1, BASE + ["--model", gpt2], [gpt2, "gpt2"])
missing = os.path.join(D, "partial.json")
open(missing, "w").write('{"model_type": "llama", "vocab_size": 1000, "hidden_size": 64}')
expect_error("config.json missing a field", 1, BASE + ["--model", missing], [missing, "intermediate_size"])

# Fields that change the computation are honoured or refused, naming the file and the field.
OPT_NOBIAS = {"model_type": "opt", "vocab_size": 1031, "hidden_size": 40, "ffn_dim": 72, "num_hidden_layers": 2,
              "num_attention_heads": 5, "max_position_embeddings": 64, "enable_bias": False}
nobias = os.path.join(D, "opt-nobias", "config.json")
os.makedirs(os.path.dirname(nobias))
open(nobias, "w").write(json.dumps(OPT_NOBIAS))
nobias_ck = os.path.join(D, "opt-nobias", "ck")
t.run(2, BASE + ["--model", nobias, "--ckpt-dir", nobias_ck])
names = list(t.checkpoint_arrays(os.path.join(nobias_ck, "step-00000002.h5")))
projection_biases = [n for n in names if n.endswith(".bias") and "layer_norm" not in n]
t.check(names and not projection_biases and any("self_attn_layer_norm.bias" in n for n in names),
        "OPT with enable_bias false trains without projection biases (checkpoint holds %d tensors, biases %s)"
        % (len(names), projection_biases[:3]))
REFUSED = [("opt", {"do_layer_norm_before": False}, "do_layer_norm_before"),
           ("opt", {"layerdrop": 0.1}, "layerdrop"),
           ("opt", {"word_embed_proj_dim": 16}, "word_embed_proj_dim"),
           ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
           ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'")]
BASES = {"opt": dict(OPT_NOBIAS, enable_bias=True),
         "llama": {"model_type": "llama", "vocab_size": 1031, "hidden_size": 48, "intermediate_size": 88,
                   "num_hidden_layers": 2, "num_attention_heads": 6, "max_position_embeddings": 64}}
BASES["qwen2"] = dict(BASES["llama"], model_type="qwen2", num_key_value_heads=2)
for i, (family, fields, needle) in enumerate(REFUSED):
    path = os.path.join(D, "refused-%d.json" % i)
    open(path, "w").write(json.dumps(dict(BASES[family], **fields)))
    expect_error("%s config with %s" % (family, fields), 1, BASE + ["--model", path], [path, needle])

# Token files.
good = list(range(200)) * 3
path = os.path.join(D, "badmagic.bin")
token_file(path, good, 1031, magic=b"NOTTOKS\0")
expect_error("token file with a bad magic", 2, BASE + ["--data", path], [path])
path = os.path.join(D, "badversion.bin")
token_file(path, good, 1031, version=9)
expect_error("token file with an unknown version", 1, BASE + ["--data", path], [path, "version"])
path = os.path.join(D, "short.bin")
token_file(path, good, 1031, count=5000)
expect_error("token file shorter than its header says", 2, BASE + ["--data", path], [path])
path = os.path.join(D, "bigvocab.bin")
token_file(path, good, 50000)
expect_error("token file vocabulary larger than the model's", 1, BASE + ["--data", path], [path, "50000"])
path = os.path.join(D, "outofrange.bin")
token_file(path, good[:100] + [1020] + good[101:], 1000)
expect_error("token id beyond the file's vocabulary", 2,
             ["train", "--seq", "16", "--mbs", "2", "--steps", "40", "--data", path], [path, "1020"])
expect_error("missing token file", 1, BASE + ["--data", os.path.join(D, "nope.bin")], ["nope.bin"])

# Checkpoints.
ck = os.path.join(D, "ck")
t.run(2, BASE + ["--model", "tiny-llama", "--ckpt-dir", ck])
real = os.path.join(ck, "step-00000002.h5")
expect_error("missing checkpoint", 2, BASE + ["--resume", os.path.join(D, "none.h5")], ["none.h5"])
trunc = os.path.join(D, "truncated.h5")
shutil.copy(real, trunc)
with open(trunc, "r+b") as f:
    f.truncate(os.path.getsize(real) // 2)
expect_error("truncated checkpoint", 2, BASE + ["--resume", trunc], [trunc])
notes = os.path.join(D, "notes.h5")
open(notes, "w").write("this is not HDF5\n" * 100)
expect_error("a non-HDF5 file as checkpoint", 2, BASE + ["--resume", notes], [notes])
expect_error("checkpoint of another model", 2, BASE + ["--model", "tiny-opt", "--resume", real], [real, "tiny-opt"])
other = os.path.join(D, "other.json")
open(other, "w").write('{"model_type": "llama", "vocab_size": 1031, "hidden_size": 48, "intermediate_size": 96, '
                       '"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, '
                       '"max_position_embeddings": 256, "tie_word_embeddings": true}')
expect_error("checkpoint of a differently shaped llama", 2, BASE + ["--model", other, "--resume", real], [real])

# Nothing half-written: no temporary files anywhere, and failed runs wrote no checkpoints.
t.check(not glob.glob(os.path.join(D, "**", "*.tmp*"), recursive=True), "no temporary files left behind")
t.check(sorted(os.listdir(ck)) == ["latest", "step-00000002.h5"], "the checkpoint directory holds only the good run")
t.finish()
