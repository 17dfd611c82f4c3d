"""tokenizer_config.json beside a tokenizer.json, applied as transformers' AutoTokenizer applies it
(src/io/special_tokens.h): a GPT-2 tokenizer.json whose post-processor puts <|endoftext|> first, in
folders with and without a config. Checked with fsdp tokenize (directory or file argument):

  - no config: the tokenizer.json's template (BOS first);
  - add_bos_token false: no BOS; add_bos_token and add_eos_token true: BOS ... EOS; add_eos_token alone
    (add_bos_token absent, so false) with another eos_token: ... EOS only;
  - a special token of the model's vocabulary that is not an added token (additional_special_tokens)
    becomes one: matched inside words, dropped by --skip-special-tokens;
  - model_max_length 1e30 (transformers' "no limit") and a chat_template are read without complaint;
  - refused in one line naming the file: a special token the tokenizer lacks, an added_tokens_decoder
    entry that is not the tokenizer.json's, a mistyped add_bos_token;
  - fsdp prepare's token file holds tokenize's ids, records the tokenizer's path and a hash that changes
    with a config that changes ids and not with one that changes none;
  - fsdp generate's prompt has tokenize's token count;
  - prepare --format chat is refused (chat templates are Jinja programs fsdp.c does not run)."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from tokfixtures import gpt2_tokenizer, read_tokens

D = t.tmpdir("tokenizer-config")
BASE = gpt2_tokenizer(os.path.join(D, "base.json"))
EOT, MASK = 50256, 50257


def folder(name, config=None):
    path = os.path.join(D, name)
    os.makedirs(path, exist_ok=True)
    shutil.copy(BASE, os.path.join(path, "tokenizer.json"))
    if config is not None:
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            f.write(config if isinstance(config, str) else json.dumps(config))
    return path


def tokenize(tok, text, *flags):
    p = subprocess.run([t.BIN, "tokenize", "--tokenizer", tok] + list(flags), input=text.encode(), capture_output=True,
                       env=t.ENV, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode().strip()


def ids(tok, text, *flags):
    rc, out, err = tokenize(tok, text + "\n", *flags)
    t.check(rc == 0, "tokenize %s: %s" % (tok, err))
    return [int(x) for x in out.split()]


plain = ids(folder("none"), "Hello world", "--no-special")
t.check(plain == [15496, 995], "GPT-2 ids of 'Hello world' without special tokens: %s" % plain)
none = folder("none")
t.check(ids(none, "Hello world") == [EOT] + plain, "no config: the tokenizer.json's template puts BOS first")
t.check(ids(os.path.join(none, "tokenizer.json"), "Hello world") == [EOT] + plain, "a file argument reads its folder")

no_bos = folder("no-bos", {"add_bos_token": False, "bos_token": "<|endoftext|>"})
t.check(ids(no_bos, "Hello world") == plain, "add_bos_token false drops the template's BOS")
both = folder("both", {"add_bos_token": True, "add_eos_token": True, "bos_token": "<|endoftext|>",
                       "eos_token": "<|endoftext|>", "model_max_length": 1000000000000000019884624838656,
                       "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
t.check(ids(both, "Hello world") == [EOT] + plain + [EOT], "add_bos_token and add_eos_token: BOS ... EOS")
t.check(ids(both, "Hello world", "--no-special") == plain, "--no-special: no template at all")
eos_only = folder("eos-only", {"add_eos_token": True, "eos_token": "<mask>", "bos_token": "<|endoftext|>"})
t.check(ids(eos_only, "Hello world") == plain + [MASK],
        "add_eos_token alone: transformers' template without BOS (add_bos_token absent is false)")
null_bos = folder("null-bos", {"add_bos_token": True, "bos_token": None})
t.check(ids(null_bos, "Hello world") == plain, "add_bos_token with a null bos_token adds nothing")

# "Hello" is in GPT-2's vocabulary (15496) but no added token: transformers adds it as a special one.
extra = folder("extra", {"additional_special_tokens": ["Hello"]})
t.check(ids(none, "xHelloy", "--no-special") != [87, 15496, 88], "without the config 'xHelloy' is not x|Hello|y")
t.check(ids(extra, "xHelloy", "--no-special") == [87, 15496, 88], "an additional special token is matched inside words")
rc, out, err = tokenize(extra, "87 15496 88\n", "--decode", "--skip-special-tokens")
t.check(rc == 0 and out == "xy\n", "--skip-special-tokens drops it: %r %s" % (out, err))

for name, config, words in (
        ("missing-token", {"bos_token": "<not a token>"}, "bos_token \"<not a token>\" is not a token"),
        ("bad-decoder", {"added_tokens_decoder": {"50257": {"content": "<other>", "special": True}}},
         "added_tokens_decoder[\"50257\"]"),
        ("bad-flag", {"add_bos_token": "yes"}, "add_bos_token must be true or false"),
        ("bad-json", "{\"add_bos_token\": true,", "tokenizer_config.json")):
    path = folder(name, config)
    rc, out, err = tokenize(path, "x\n")
    lines = err.splitlines()
    t.check(rc != 0 and out == "" and len(lines) == 1 and "tokenizer_config.json" in lines[0] and words in lines[0],
            "%s refused in one line naming the file: %r" % (name, err))

empty = os.path.join(D, "empty")
os.makedirs(empty)
rc, out, err = tokenize(empty, "x\n")
t.check(rc != 0 and err.splitlines() == ["fsdp: error: --tokenizer %s is a directory without a tokenizer.json" % empty],
        "a directory without a tokenizer.json: one line: %r" % err)

# prepare: tokenize's ids, the tokenizer's path, and a hash that follows the ids
docs = os.path.join(D, "docs.jsonl")
texts = ["Hello world", "xHelloy and more", "A third <mask> line"]
with open(docs, "w") as f:
    for x in texts:
        f.write(json.dumps({"text": x}) + "\n")
same = folder("same", {"bos_token": {"content": "<|endoftext|>", "lstrip": False, "rstrip": False,
                                     "normalized": True, "single_word": False, "special": True}})
hashes = {}
for name, path in (("none", none), ("no-bos", no_bos), ("extra", extra), ("same", same)):
    out = os.path.join(D, name + ".bin")
    p = subprocess.run([t.BIN, "prepare", "--tokenizer", path, "--input", docs, "--format", "jsonl", "--out", out,
                        "--quiet"], capture_output=True, text=True, env=t.ENV, timeout=120)
    t.check(p.returncode == 0, "prepare --tokenizer %s: %s" % (name, p.stderr.strip()))
    tok = read_tokens(out)
    starts = tok["documents"]
    got = [tok["ids"][starts[i]:starts[i + 1]] for i in range(len(starts) - 1)]
    t.check(got == [ids(path, x) for x in texts], "%s: prepare's documents are tokenize's ids" % name)
    data = open(out, "rb").read()
    t.check(data.endswith(os.path.realpath(path).encode() + len(os.path.realpath(path).encode()).to_bytes(4, "little")),
            "%s: the token file records the tokenizer's path" % name)
    hashes[name] = tok["hash"]
t.check(hashes["none"] != hashes["no-bos"] and hashes["none"] != hashes["extra"] and hashes["no-bos"] != hashes["extra"],
        "configs that change ids change the hash: %s" % hashes)
t.check(hashes["same"] == hashes["none"], "a config that changes no id keeps the tokenizer.json's hash")

# model_max_length: prepare counts the longer documents; eos_token: the EOS that ends Alpaca responses
short = folder("short", {"model_max_length": 3, "eos_token": "<mask>"})
p = subprocess.run([t.BIN, "prepare", "--tokenizer", short, "--input", docs, "--format", "jsonl", "--out",
                    os.path.join(D, "short.bin")], capture_output=True, text=True, env=t.ENV, timeout=120)
longer = sum(len(ids(short, x)) > 3 for x in texts)
t.check(p.returncode == 0 and longer == 2 and
        "%d documents are longer than the tokenizer's model_max_length of 3 tokens" % longer in p.stdout,
        "prepare counts documents beyond model_max_length: %s" % p.stdout[-300:])
alpaca = os.path.join(D, "alpaca.json")
json.dump([{"instruction": "Say hi", "input": "", "output": "Hello world"}], open(alpaca, "w"))
for name, path, eos in (("none", none, EOT), ("short", short, MASK)):
    out = os.path.join(D, name + "-alpaca.bin")
    p = subprocess.run([t.BIN, "prepare", "--tokenizer", path, "--input", alpaca, "--format", "alpaca", "--out", out,
                        "--quiet"], capture_output=True, text=True, env=t.ENV, timeout=120)
    t.check(p.returncode == 0 and read_tokens(out)["ids"][-3:] == plain + [eos],
            "alpaca with %s ends the response with %d" % (name, eos))

p = subprocess.run([t.BIN, "prepare", "--tokenizer", both, "--input", docs, "--format", "chat", "--out",
                    os.path.join(D, "chat.bin")], capture_output=True, text=True, env=t.ENV, timeout=60)
t.check(p.returncode != 0 and "Jinja" in p.stderr and len(p.stderr.strip().splitlines()) == 1 and
        not os.path.exists(os.path.join(D, "chat.bin")), "--format chat refused in one line: %r" % p.stderr)

# generate: the prompt as tokenize encodes it (its token count on the header line)
cfg = os.path.join(D, "config.json")
with open(cfg, "w") as f:
    json.dump({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 50304,
               "max_position_embeddings": 64, "bos_token_id": EOT, "eos_token_id": EOT}, f)
model = os.path.join(D, "model")
t.run(1, ["export", "--model", cfg, "--out", model])
for name, path in (("none", none), ("no-bos", no_bos), ("both", both)):
    p = subprocess.run([t.BIN, "generate", "--init-from", model, "--tokenizer", path, "--prompt", "Hello world",
                        "--max-new-tokens", "2", "--device", "cpu", "--temperature", "0"], capture_output=True,
                       text=True, env=t.ENV, timeout=120)
    want = "prompt %d tokens" % len(ids(path, "Hello world"))
    t.check(p.returncode == 0 and want in p.stderr + p.stdout, "generate with %s: %s (%s)" % (name, want, p.stderr[-300:]))
t.finish()
