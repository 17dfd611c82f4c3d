"""fsdp prepare end to end: for each format a round trip (decoding the documents gives the input back:
files, blank-line paragraphs, JSON Lines fields, Alpaca prompt + response), Alpaca masks over the
response and EOS only (and ids equal to Hugging Face tokenizers' for the prompt and the response),
the same bytes for 1 and 3 threads, a deterministic validation split, memory bounded on an input
several times the bound (peak RSS), every bad input refused with one line naming file and line and
nothing written, and fsdp train on a version 2 file (--packing stream) training exactly as on a
version 1 file of its stream: the documents joined by the rule of docs/FORMATS.md, written by
tests/lib/packing.py."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing  # noqa: E402
from tokfixtures import decode, documents, fixtures, gpt2_tokenizer, read_tokens

D = t.tmpdir("prepare")
FX = fixtures()
LLAMA2 = os.path.join(FX, "llama2", "tokenizer.json")
LLAMA3 = os.path.join(FX, "llama3", "tokenizer.json")
GPT2 = gpt2_tokenizer(os.path.join(D, "gpt2.json"))
ORACLE = os.path.join(t.ROOT, "tests", "lib", "tokenizers_oracle.js")


def path(name):
    return os.path.join(D, name)


def write(name, content, mode="w"):
    with open(path(name), mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        f.write(content)
    return path(name)


def prepare(args, check=True, timeout=600):
    p = subprocess.run([t.BIN, "prepare", "--quiet"] + args, capture_output=True, text=True, env=t.ENV, timeout=timeout)
    if check:
        t.check(p.returncode == 0, "prepare %s: exit %d %s" % (" ".join(args), p.returncode, p.stderr[-600:]))
    return p


# ---- text, one document per file ----------------------------------------------------------------
files = [write("a.txt", "The first file.\nIt has two lines.\n"),
         write("b.txt", "  Second: naïve café, 中文, emoji 😀\n\n\nwith blank lines inside\tand tabs"),
         write("c.txt", "third\r\nwith CRLF\r\n")]
texts = [open(f, encoding="utf-8", newline="").read() for f in files]
for tok in (LLAMA2, LLAMA3, GPT2):
    out = path("files.bin")
    prepare(["--tokenizer", tok, "--input"] + files + ["--format", "text", "--out", out])
    tf = read_tokens(out)
    t.check(tf["version"] == 2 and tf["mask"] is None and len(tf["documents"]) == 4,
            "text files: version 2, no mask, 3 documents (%s)" % tok)
    t.check(decode(tok, documents(tf)) == texts, "text files round trip (%s)" % tok)
    same = open(out, "rb").read()
    prepare(["--tokenizer", tok, "--input=" + files[0], "--format", "text", "--out", out, "--input"] + files[1:])
    t.check(open(out, "rb").read() == same, "--input=A ... --input B C reads the same files in the same order")

# ---- text, documents between blank lines --------------------------------------------------------
paragraphs = ["= Title =\n", "First paragraph, line one.\nLine two.\n", "Second — with ünïcödé.\n", " indented last\n"]
wiki = write("wiki.txt", "\n" + paragraphs[0] + " \n" + paragraphs[1] + "\n\n\t\n" + paragraphs[2] + "\n" + paragraphs[3])
out = path("wiki.bin")
prepare(["--tokenizer", LLAMA2, "--input", wiki, "--format", "text", "--split-on", "blank-lines", "--out", out])
tf = read_tokens(out)
t.check(decode(LLAMA2, documents(tf)) == paragraphs, "blank-lines round trip: %r" % decode(LLAMA2, documents(tf)))
t.check(all(d[0] == 1 for d in documents(tf)), "each Llama 2 document starts with BOS (its post-processor)")
prepare(["--tokenizer", LLAMA2, "--input", wiki, "--format", "text", "--split-on", "blank-lines", "--out", out,
         "--no-special"])
t.check(all(d[0] != 1 for d in documents(read_tokens(out))), "--no-special: no BOS")

# ---- JSON Lines ---------------------------------------------------------------------------------
records = [{"text": "alpha line", "id": 1}, {"text": "beta\nwith a newline and \"quotes\"", "meta": {"x": 2}},
           {"text": ""}, {"text": "gamma \u00e9\u00e8 \\ backslash"}]
jl = write("docs.jsonl", "\n".join(json.dumps(r) for r in records) + "\n\n")
out = path("jsonl.bin")
prepare(["--tokenizer", LLAMA3, "--input", jl, "--format", "jsonl", "--out", out])
got = decode(LLAMA3, documents(read_tokens(out)))
t.check(got == [r["text"] for r in records if r["text"]], "jsonl round trip (empty texts skipped): %r" % got)
jl2 = write("body.jsonl", json.dumps({"body": "other field"}) + "\n")
prepare(["--tokenizer", LLAMA3, "--input", jl2, "--format", "jsonl", "--field", "body", "--out", out])
t.check(decode(LLAMA3, documents(read_tokens(out))) == ["other field"], "jsonl --field")

# ---- Alpaca ---------------------------------------------------------------------------------------
HEAD_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
              "Write a response that appropriately completes the request.\n\n### Instruction:\n")
HEAD = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\n")
alpaca = [{"instruction": "Give three tips for staying healthy.", "input": "", "output": "1. Eat well.\n2. Sleep.\n3. Move."},
          {"instruction": "Translate to French.", "input": "Good morning, friend.", "output": "Bonjour, mon ami."},
          {"instruction": "Résume ceci", "output": " Leading space and 中文 😀"}]
prompts = [(HEAD_INPUT + r["instruction"] + "\n\n### Input:\n" + r["input"] if r.get("input") else HEAD + r["instruction"])
           + "\n\n### Response:\n" for r in alpaca]
array_file = write("alpaca.json", json.dumps(alpaca, indent=2, ensure_ascii=False))
lines_file = write("alpaca.jsonl", "\n".join(json.dumps(r, ensure_ascii=False) for r in alpaca) + "\n")
for tok, eos in ((LLAMA2, 2), (LLAMA3, 128001), (GPT2, 50256)):
    outs = []
    for src in (array_file, lines_file):
        out = path("alpaca-%d.bin" % len(outs))
        prepare(["--tokenizer", tok, "--input", src, "--format", "alpaca", "--out", out])
        outs.append(open(out, "rb").read())
    t.check(outs[0] == outs[1], "alpaca: the JSON array and JSON Lines give the same file (%s)" % tok)
    tf = read_tokens(out)
    docs = documents(tf)
    s = tf["documents"]
    masks = [tf["mask"][s[i]:s[i + 1]] for i in range(len(docs))]
    ok = len(docs) == 3 and tf["mask"] is not None
    prompt_ids, response_ids = [], []
    for d, m in zip(docs, masks):
        k = m.index(1) if 1 in m else len(m)
        ok = ok and all(x == 0 for x in m[:k]) and all(x == 1 for x in m[k:]) and d[-1] == eos and k < len(d)
        prompt_ids.append(d[:k])
        response_ids.append(d[k:-1])
    t.check(ok, "alpaca masks: 0 over the prompt, 1 over the response and its EOS %d (%s)" % (eos, tok))
    t.check(decode(tok, prompt_ids) == prompts, "alpaca prompts decode to the Stanford template (%s)" % tok)
    t.check(decode(tok, response_ids) == [r["output"] for r in alpaca], "alpaca responses round trip (%s)" % tok)
    # the ids themselves, against tokenizers: prompt with special tokens, response without
    for part, ids, special in (("prompt", prompt_ids, "special"), ("response", response_ids, "nospecial")):
        src = write("oracle-in.jsonl", "".join(json.dumps(x) + "\n" for x in
                                               (prompts if part == "prompt" else [r["output"] for r in alpaca])))
        subprocess.run(["node", ORACLE, os.path.join(FX, "node"), tok, "encode", src, path("oracle-out"), special],
                       check=True, timeout=300)
        want = open(path("oracle-out")).read().split("\n")[:-1]
        t.check([" ".join(map(str, x)) for x in ids] == want, "alpaca %s ids equal tokenizers' (%s)" % (part, tok))

# ---- threads and the validation split -----------------------------------------------------------
brown = os.path.join(FX, "brown.txt")
if t.SANITIZED:  # its first 800 kB, whole paragraphs: the same code paths at a sixth of the instrumented time
    head = open(brown, encoding="utf-8").read()
    brown = write("brown-head.txt", head[:head.index("\n\n", 800_000) + 2])
runs = {}
for threads in (1, 3):
    out = path("t%d.bin" % threads)
    prepare(["--tokenizer", GPT2, "--input", brown, os.path.join(FX, "fortunes.txt"), "--format", "text",
             "--split-on", "blank-lines", "--out", out, "--val-fraction", "0.1", "--seed", "7", "--threads", str(threads)])
    runs[threads] = (open(out, "rb").read(), open(path("t%d.val.bin" % threads), "rb").read())
t.check(runs[1] == runs[3], "the same training and validation files for 1 and 3 threads")
train, val = read_tokens(path("t1.bin")), read_tokens(path("t1.val.bin"))
nt, nv = len(train["documents"]) - 1, len(val["documents"]) - 1
t.check(0.07 < nv / (nt + nv) < 0.13, "about 10%% of documents in validation: %d of %d" % (nv, nt + nv))
prepare(["--tokenizer", GPT2, "--input", brown, "--format", "text", "--split-on", "blank-lines", "--out",
         path("s8.bin"), "--val-fraction", "0.1", "--seed", "8"])
t.check(open(path("s8.val.bin"), "rb").read() != runs[1][1], "another --seed, another split")
whole = path("whole.bin")
prepare(["--tokenizer", GPT2, "--input", brown, os.path.join(FX, "fortunes.txt"), "--format", "text", "--split-on",
         "blank-lines", "--out", whole])
all_docs = documents(read_tokens(whole))
t.check(sorted(map(tuple, documents(train) + documents(val))) == sorted(map(tuple, all_docs)),
        "training + validation documents are exactly the documents")

# ---- bounded memory -----------------------------------------------------------------------------
def peak_rss_mb(args):
    """Peak RSS of fsdp prepare, measured by GNU time (a child of this large Python process would
    count the pages it inherited before exec)."""
    p = subprocess.run(["/usr/bin/time", "-f", "peak-kb %M", t.BIN, "prepare", "--quiet"] + args, env=t.ENV,
                       capture_output=True, text=True, timeout=600)
    t.check(p.returncode == 0, "prepare for the memory test: %s" % p.stderr[-300:])
    return int(p.stderr.strip().splitlines()[-1].split()[-1]) / 1024.0


big = path("big.txt")
with open(big, "w", encoding="utf-8") as f:
    text = open(brown, encoding="utf-8").read()
    # Under the sanitizers the bound is not checked (below): a smaller file runs the same streaming.
    while f.tell() < (8_000_000 if t.SANITIZED else 60_000_000):
        f.write(text)
size_mb = os.path.getsize(big) / 1e6
small = write("small.txt", "a few words\n")
base = peak_rss_mb(["--tokenizer", GPT2, "--input", small, "--out", path("small.bin"), "--max-memory", "16"])
peak = peak_rss_mb(["--tokenizer", GPT2, "--input", big, "--format", "text", "--split-on", "blank-lines", "--out",
                    path("big.bin"), "--max-memory", "16", "--threads", "2"])
print("memory: %.0f MB input, --max-memory 16: peak RSS %.0f MB, %.0f MB with a tiny input" % (size_mb, peak, base))
if "ASAN_OPTIONS" in os.environ:
    # AddressSanitizer keeps freed blocks in its quarantine and maps shadow memory for what was
    # touched, so RSS measures it, not fsdp prepare: the bound is checked by the uninstrumented suite.
    print("(peak RSS bound not checked under AddressSanitizer)")
else:
    t.check(size_mb > 3 * 16 and peak - base < 16 + 8, "peak RSS grows by %.0f MB on %.0f MB of input (bound 16 MB)" %
            (peak - base, size_mb))
t.check(read_tokens(path("big.bin"))["ids"][:50] == read_tokens(whole)["ids"][:50], "the big file starts as the Brown corpus does")
os.remove(big)
os.remove(path("big.bin"))

# ---- bad inputs -----------------------------------------------------------------------------------
def expect_error(what, args, needles, status=1):
    out = path("bad.bin")
    for f in (out, out + ".tmp"):
        if os.path.exists(f):
            os.remove(f)
    start = time.time()
    given = {a for a in args if a.startswith("--")}
    base = (["--tokenizer", GPT2] if "--tokenizer" not in given else []) + (["--out", out] if "--out" not in given else [])
    p = prepare(base + args, check=False, timeout=60)
    lines = [l for l in p.stderr.splitlines() if l.startswith("fsdp:")]
    ok = (p.returncode == status and len(lines) == 1 and lines[0].startswith("fsdp: error:") and
          all(n in lines[0] for n in needles) and len(p.stderr.strip().splitlines()) == 1)
    left = [f for f in os.listdir(D) if f.startswith("bad.bin")]
    t.check(ok and not left and time.time() - start < 30,
            "%s -> exit %d, %r, left %s" % (what, p.returncode, p.stderr.strip()[-300:], left))


bad_jsonl = write("missing.jsonl", '{"text": "ok"}\n{"text": "ok"}\n{"body": "no text"}\n')
expect_error("missing field", ["--input", bad_jsonl, "--format", "jsonl"], [bad_jsonl, "line 3", 'no field "text"'])
malformed = write("malformed.jsonl", '{"text": "ok"}\n{"text": "unterminated}\n')
expect_error("malformed JSON line", ["--input", malformed, "--format", "jsonl"], [malformed, "line 2", "column"])
notobj = write("notobj.jsonl", '["a list"]\n')
expect_error("JSON line not an object", ["--input", notobj, "--format", "jsonl"], [notobj, "line 1", "not a JSON object"])
binary = write("binary.bin.txt", b"text\nmore\n\x7fELF\x02\x01\x00\xff\xfe\x00\x00\n", "wb")
expect_error("binary file", ["--input", binary], [binary, "line 3", "a binary file"])
nul = write("nul.txt", b"fine\nfine\nnul \x00 here\n", "wb")
expect_error("NUL byte", ["--input", nul, "--format", "text", "--split-on", "blank-lines"], [nul, "line 3", "NUL"])
empty = write("empty.txt", "")
expect_error("empty input", ["--input", small, empty], [empty, "no documents"])
blank = write("blank.txt", "\n \n\t\n")
expect_error("only blank lines", ["--input", blank, "--split-on", "blank-lines"], [blank, "no documents"])
expect_error("missing file", ["--input", path("nope.txt")], [path("nope.txt"), "No such file"])
expect_error("a directory", ["--input", D], [D, "is a directory"])
fifo = path("fifo")
os.mkfifo(fifo)
expect_error("a FIFO (must not block)", ["--input", fifo], [fifo, "not a regular file"])
locked = write("locked.txt", "secret")
os.chmod(locked, 0)
if os.geteuid() == 0:  # root reads any file: run this one as nobody
    p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", t.BIN, "prepare", "--quiet",
                        "--tokenizer", GPT2, "--input", locked, "--out", path("bad.bin")], capture_output=True,
                       text=True, env=t.ENV, timeout=60)
    t.check(p.returncode == 1 and p.stderr.strip() == "fsdp: error: %s: not readable" % locked,
            "unreadable file (as nobody) -> exit %d, %r" % (p.returncode, p.stderr[-300:]))
else:
    expect_error("unreadable file", ["--input", locked], [locked, "not readable"])
no_output = write("alpaca-bad.json", json.dumps([{"instruction": "a", "output": "b"}, {"instruction": "c"}]))
expect_error("alpaca record without output", ["--input", no_output, "--format", "alpaca"],
             [no_output, "record 2", 'no field "output"'])
no_instr = write("alpaca-bad.jsonl", json.dumps({"instruction": "a", "output": "b"}) + "\n" + json.dumps({"output": "b"}))
expect_error("alpaca line without instruction", ["--input", no_instr, "--format", "alpaca"],
             [no_instr, "line 2", 'no field "instruction"'])
huge = write("huge.txt", "x" * 1_200_000)
expect_error("a document above the bound", ["--input", huge, "--max-memory", "12"], [huge, "line 1", "--max-memory"])
expect_error("output directory missing", ["--input", small, "--out", path("no/such/dir/out.bin")],
             [path("no/such/dir/out.bin")])
expect_error("--input is the output", ["--input", small, "--out", small], [small, "both"], status=2)
expect_error("no --input", ["--format", "text"], ["--input"], status=2)
expect_error("EOS not in tokenizer", ["--input", lines_file, "--format", "alpaca", "--eos-token", "<eos>"],
             ["--eos-token", "<eos>"], status=2)
bad_tok = write("bad-tokenizer.json", json.dumps({"model": {"type": "Unigram", "vocab": []}}))
expect_error("unsupported tokenizer", ["--input", small, "--tokenizer", bad_tok], [bad_tok, "model.type 'Unigram'"])
t.check(not [f for f in os.listdir(D) if ".tmp" in f], "no temporary files left")

# ---- fsdp train on version 2 --------------------------------------------------------------------
cfg = path("config.json")
# GPT-2's <|endoftext|> (50256) is the model's EOS and, by the test tokenizer's template, every
# document's first token: EOS goes only after the last document.
json.dump({"model_type": "llama", "vocab_size": 50304, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
           "eos_token_id": 50256}, open(cfg, "w"))
v2 = path("t1.bin")
v1 = path("v1.bin")
joined, _ = packing.stream(read_tokens(v2), 50256)
t.check(len(joined) == len(read_tokens(v2)["ids"]) + 1, "the stream adds one EOS: after the last document")
packing.write_v1(v1, joined, 50261)
losses = {}
for name, data in (("v2", v2), ("v1", v1)):
    m = path("metrics-%s.jsonl" % name)
    t.run(1, ["train", "--model", cfg, "--data", data, "--seq", "32", "--mbs", "2", "--steps", "3", "--metrics", m,
              "--lr", "1e-3"])
    losses[name] = [r["loss"] for r in t.metrics(m)[0]]
t.check(len(losses["v2"]) == 3 and all(x == x and x > 0 for x in losses["v2"]), "training on a version 2 file: %s" % losses)
t.check(losses["v2"] == losses["v1"], "the same losses on version 2 as on its stream in version 1: %s" % losses)
t.finish()
