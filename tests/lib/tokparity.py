"""The comparison of fsdp tokenize with Hugging Face's tokenizers (the Rust library as the Node module
@anush008/tokenizers, tests/lib/tokenizers_oracle.js) shared by the parity tests: the texts (English from
the fixtures, hard lines, special-token lines, random lines) and compare(), which checks identical ids
with and without add_special_tokens, identical decoded text with and without skip_special_tokens, and
(optionally) decode(encode(x)) == x."""
import json
import os
import random
import subprocess
import sys

import fsdptest as t
from tokfixtures import fixtures

D = t.tmpdir(os.path.splitext(os.path.basename(sys.argv[0]))[0])  # one folder per test script
ORACLE = os.path.join(t.ROOT, "tests", "lib", "tokenizers_oracle.js")
FX = fixtures()
ENGLISH_BYTES = 1_300_000


def english(limit=None):
    texts, size = [], 0
    for line in open(os.path.join(FX, "brown.txt"), encoding="utf-8"):
        texts.append(line.rstrip("\n"))
        size += len(line.encode())
        if size > (limit or ENGLISH_BYTES):
            break
    fortunes = open(os.path.join(FX, "fortunes.txt"), encoding="utf-8", errors="replace").read().split("\n%\n")
    for f in fortunes[:1500 if limit is None else max(1, limit // 1000)]:
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
    return read_lines(out_path) if mode != "all" else None


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
    oracle(tok, "all", base + ".jsonl", base + ".hf", "")  # one load of the tokenizer for all four
    for mode in ("special", "nospecial"):
        flags = [] if mode == "special" else ["--no-special"]
        got = ours(tok, ["--json"] + flags, base + ".jsonl", base + ".ours." + mode)
        want = read_lines(base + ".hf." + mode)
        bad = mismatches("%s ids (%s)" % (name, mode), texts, got, want)
        t.check(bad == 0 and len(got) == len(texts), "%s: %d of %d lines differ from tokenizers (%s)" % (name, bad, len(texts), mode))
        if mode == "special":
            ids_path = base + ".ours." + mode
    # the oracle decoded its own ids, which are ours when the check above passed
    for skip in ("skip", "keep"):
        flags = ["--skip-special-tokens"] if skip == "skip" else []
        got = ours(tok, ["--decode", "--json"] + flags, ids_path, base + ".dec." + skip)
        want = read_lines(base + ".hf." + skip)
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



# Lines that Unicode normalization changes (NFC, NFD, NFKC, NFKD) or that case mapping treats specially:
# combining marks in both orders, precomposed and decomposed Hangul, compatibility characters (ligatures,
# full-width and half-width forms, circled and superscript digits, roman numerals, squared words),
# singletons (the ohm and angstrom signs), and Greek final sigma and dotted I for Lowercase.
UNICODE = [
    "e\u0301 \u00e9 a\u0308\u0301 a\u0301\u0308 q\u0323\u0307 q\u0307\u0323 \u1e0b\u0323 d\u0323\u0307",
    "\u1112\u1161\u11ab\u1100\u1173\u11af \ud55c\uae00 \u1100\u1161", "\u212b \u2126 \u212a \u00c5 \u03a9",
    "\ufb01ne \ufb02ow \ufb00 \ufb03x \ufb04 \ufb05 \ufb06", "\uff21\uff22\uff23 \uff11\uff12\uff13 \uff71\uff72\uff73 \uff8a\uff9f",
    "\u2460\u2461\u2462 \u00b2 \u00b3 \u00b9 x\u00b2+y\u00b2 \u2153 \u00bd \u2168 \u2173 \u3231 \u337f \u3392",
    "\u01c4 \u01c5 \u01c6 \u0132 \u2025 \u2026 \u00a0 \u2002 \u3000 \u00a8 \u00b4 \u02dc",
    "\u039f\u0394\u039f\u03a3 \u03a3\u0391\u03a3 \u03a3.\u03a3 \u0391\u03a3' \u03a3 \u1f08\u03a3 \u0130stanbul \u0049\u0307",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01 \u3053\u3093\u306b\u3061\u306f \u30ac \u30ab\u3099 \uf900 \u2f00 \u2e9f",
    "\U0001F600 \U0001F44D\U0001F3FD \u2764\ufe0f \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EB\U0001F1F7 \U0001D400\U0001D7D8",
    "caf\u00e9 cafe\u0301 na\u00efve nai\u0308ve \u00c5ngstr\u00f6m A\u030angstro\u0308m",
    "\u0915\u094d\u0937 \u0958 \u0915\u093c \u09cb \u09c7\u09be \u0b48 \u0f73 \u0f71\u0f72",
    "MIXED Case \u00c9T\u00c9 \u00dcBER \u1e9e \u0178 \u2c6f \u023a \u2c65 \u10a0 \u13a0 \uab70",
    "  padded both ends  ", "\t\n tabs and newlines \n\t", "\u3000ideographic\u3000", "\u00a0nbsp\u00a0",
]
