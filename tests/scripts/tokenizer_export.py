"""Exports carry their tokenizer (src/io/tokenizer_export.h): a tiny Llama trained two steps on text
prepared with Llama 2's tokenizer.json (from a folder of its own), then exported:

  - without --tokenizer: the export finds the tokenizer through the checkpoint's identity record (the
    path prepare recorded in the token file), copies tokenizer.json byte for byte and writes
    tokenizer_config.json (PreTrainedTokenizerFast, the model's special tokens, model_max_length) and
    special_tokens_map.json; `fsdp generate --init-from EXPORT` then works with no --tokenizer, the
    export tokenizes as the original and has its hash (so --init-from EXPORT --data trains on);
  - with --tokenizer DIR holding a tokenizer_config.json and a special_tokens_map.json: both copied as
    they are; --force over an export replaces its tokenizer files;
  - the tokenizer changed or removed since prepare: one line says the export has no tokenizer and how
    to add one, and the export holds none;
  - a tokenizer with more ids than the model: refused, nothing written."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from tokfixtures import fixtures

D = t.tmpdir("tokenizer-export")
FX = fixtures()
tokdir = os.path.join(D, "llama2-tokenizer")
os.makedirs(tokdir)
shutil.copy(os.path.join(FX, "llama2", "tokenizer.json"), tokdir)
text = os.path.join(D, "text.txt")
with open(os.path.join(FX, "brown.txt"), encoding="utf-8") as f, open(text, "w", encoding="utf-8") as o:
    o.write(f.read(60000))
data = os.path.join(D, "data.bin")
t.run(1, ["prepare", "--tokenizer", tokdir, "--input", text, "--out", data, "--quiet"])
cfg = os.path.join(D, "config.json")
with open(cfg, "w") as f:
    json.dump({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 32000,
               "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2}, f)
ckpt = os.path.join(D, "ckpt")
t.run(1, ["train", "--model", cfg, "--data", data, "--seq", "32", "--mbs", "2", "--steps", "2", "--ckpt-dir", ckpt])


def tokenize(tok, line):
    p = subprocess.run([t.BIN, "tokenize", "--tokenizer", tok], input=(line + "\n").encode(), capture_output=True,
                       env=t.ENV, timeout=120)
    return p.stdout.decode().strip() if p.returncode == 0 else "error: " + p.stderr.decode()


def files(d):
    return sorted(n for n in os.listdir(d) if not n.startswith("."))


# 1. found again through the checkpoint
exp = os.path.join(D, "export")
rc, out, err = t.run(1, ["export", "--checkpoint", ckpt, "--out", exp])
t.check(files(exp) == ["config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                       "tokenizer.json", "tokenizer_config.json"], "the export holds the tokenizer files: %s" % files(exp))
t.check(open(os.path.join(exp, "tokenizer.json"), "rb").read() == open(os.path.join(tokdir, "tokenizer.json"), "rb").read(),
        "tokenizer.json is copied byte for byte")
tc = json.load(open(os.path.join(exp, "tokenizer_config.json")))
stm = json.load(open(os.path.join(exp, "special_tokens_map.json")))
t.check(tc.get("tokenizer_class") == "PreTrainedTokenizerFast" and tc.get("model_max_length") == 128 and
        tc["bos_token"]["content"] == "<s>" and tc["eos_token"]["content"] == "</s>" and tc["unk_token"]["content"] == "<unk>",
        "tokenizer_config.json written from the model's special tokens: %s" % tc)
t.check(stm["bos_token"]["content"] == "<s>" and stm["eos_token"]["content"] == "</s>",
        "special_tokens_map.json written: %s" % stm)
line = "The jury said it did find that the City Executive Committee"
t.check(tokenize(exp, line) == tokenize(tokdir, line), "the export tokenizes as the original: %s" % tokenize(exp, line))
p = subprocess.run([t.BIN, "generate", "--init-from", exp, "--prompt", "The jury", "--max-new-tokens", "3",
                    "--device", "cpu"], capture_output=True, text=True, env=t.ENV, timeout=120)
t.check(p.returncode == 0 and p.stdout.startswith("The jury"), "generate --init-from EXPORT without --tokenizer: %s%s" %
        (p.stdout[-200:], p.stderr[-300:]))
rc, out, err = t.run(1, ["train", "--init-from", exp, "--data", data, "--seq", "32", "--mbs", "2", "--steps", "1"],
                     check=False)
t.check(rc == 0, "--init-from EXPORT --data (the same tokenizer hash): %s" % err[-300:])

# 2. --tokenizer DIR with its own config and map; --force replaces the export's tokenizer files
own = os.path.join(D, "own-tokenizer")
os.makedirs(own)
shutil.copy(os.path.join(tokdir, "tokenizer.json"), own)
config_text = json.dumps({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                          "model_max_length": 4096, "tokenizer_class": "LlamaTokenizerFast", "legacy": True})
map_text = json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
open(os.path.join(own, "tokenizer_config.json"), "w").write(config_text)
open(os.path.join(own, "special_tokens_map.json"), "w").write(map_text)
rc, out, err = t.run(1, ["export", "--checkpoint", ckpt, "--out", exp, "--force", "--tokenizer", own])
t.check(open(os.path.join(exp, "tokenizer_config.json")).read() == config_text and
        open(os.path.join(exp, "special_tokens_map.json")).read() == map_text,
        "--tokenizer DIR: its tokenizer_config.json and special_tokens_map.json copied as they are, over the old ones")
t.check(not any(n.startswith("export.fsdp-export") for n in os.listdir(D)), "no staging or old directory left")

# 3. the tokenizer changed, or gone, since prepare
doc = json.load(open(os.path.join(tokdir, "tokenizer.json"), encoding="utf-8"))
doc["added_tokens"][0]["lstrip"] = not doc["added_tokens"][0]["lstrip"]
json.dump(doc, open(os.path.join(tokdir, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
for what, words in (("changed", "has changed since"), ("gone", "is gone")):
    if what == "gone":
        shutil.rmtree(tokdir)
    out_dir = os.path.join(D, "export-" + what)
    rc, out, err = t.run(1, ["export", "--checkpoint", ckpt, "--out", out_dir])
    said = [l for l in (out + err).splitlines() if "no tokenizer" in l]
    t.check(rc == 0 and len(said) == 1 and words in said[0] and "--tokenizer" in said[0] and
            "tokenizer.json" not in files(out_dir), "%s tokenizer: one line, no tokenizer files: %s" % (what, said))

# 4. more ids than the model
small = os.path.join(D, "small.json")
with open(small, "w") as f:
    json.dump(dict(json.load(open(cfg)), vocab_size=1000), f)
rc, out, err = t.run(1, ["export", "--model", small, "--out", os.path.join(D, "export-small"), "--tokenizer", own],
                     check=False)
t.check(rc != 0 and "beyond the model's vocabulary of 1000" in err and not os.path.exists(os.path.join(D, "export-small", "config.json")),
        "a tokenizer larger than the model is refused: %s" % err.strip()[-200:])
t.finish()
