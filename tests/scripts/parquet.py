"""fsdp prepare --format parquet (and Alpaca records from Parquet): the token files from Parquet equal,
byte for byte, those from the same texts given as JSON Lines, for files written by two writers that are
not fsdp.c's reader (npm's hyparquet-writer: data pages v2, dictionary on and off, Snappy, gzip, Zstd,
none; parquetjs-lite: data pages v1 and v2, PLAIN, Snappy, gzip, none), with nulls (skipped and counted
in prepare's report), empty texts, several row groups and pages, several files in one run, and the
files pyarrow wrote on the GPU host when tests/data/parquet is there (tests/scripts/gpu_parquet_files.py).
Malformed inputs (not Parquet, truncated, a footer length past the file, an unsupported codec, a column
that is not text, a missing column, a page above the memory bound) are refused with one line naming
the file and nothing written."""
import fcntl
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import parquet_texts as pt
from tokfixtures import fixtures, read_tokens

D = t.tmpdir("parquet")
FX = fixtures()
LLAMA2 = os.path.join(FX, "llama2", "tokenizer.json")
DATA = os.path.join(t.ROOT, "tests", "data", "parquet")
WRITERS = {"hyparquet-writer": "0.17.0", "parquetjs-lite": "0.8.7"}


def path(name):
    return os.path.join(D, name)


def writers_dir():
    """npm's two Parquet writers, installed once into the fixture cache (outside git), as tools/fixtures.sh does."""
    where = os.path.join(FX, "parquet-writers")
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(where, ".done")):
            subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", where]
                           + ["%s@%s" % kv for kv in WRITERS.items()], check=True)
            open(os.path.join(where, ".done"), "w").close()
    return where


def write_parquet(specs):
    p = subprocess.run(["node", os.path.join(t.ROOT, "tests", "lib", "parquet_write.mjs"), writers_dir()],
                       input=json.dumps(specs), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("parquet_write.mjs: " + p.stderr[-2000:])


def write_jsonl(name, records):
    with open(path(name), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path(name)


def prepare(inputs, fmt, out, extra=()):
    return subprocess.run([t.BIN, "prepare", "--quiet", "--threads", "1", "--tokenizer", LLAMA2, "--input"] + inputs
                          + ["--format", fmt, "--out", out] + list(extra), capture_output=True, text=True, env=t.ENV,
                          timeout=600)


def nulls_reported(stdout):
    for line in stdout.splitlines():
        if line.startswith("skipped "):
            return int(line.split()[1])
    return 0


def compare(parquet_inputs, fmt, references, extra=()):
    """(ok, message, nulls reported) of prepare on the Parquet files against prepare on their JSON Lines."""
    a, b = path("from-parquet.bin"), path("from-jsonl.bin")
    for f in (a, b):
        if os.path.exists(f):
            os.remove(f)
    p = prepare(parquet_inputs, fmt, a, extra)
    q = prepare(references, "jsonl" if fmt == "parquet" else fmt, b, extra)
    if p.returncode != 0 or q.returncode != 0:
        return False, "prepare exit %d/%d: %s%s" % (p.returncode, q.returncode, p.stderr[-800:], q.stderr[-800:]), -1
    same = open(a, "rb").read() == open(b, "rb").read() and read_tokens(a)["documents"] == read_tokens(b)["documents"]
    return same, "the token file equals the one from JSON Lines", nulls_reported(p.stdout)


def same_tokens(parquet_inputs, fmt, references, nulls, what, extra=()):
    """prepare on the Parquet files and on the JSON Lines references (one per file) give the same bytes,
    and the nulls skipped are reported. The files go through one prepare run (a run costs more than
    the reading); on a difference each file is compared alone, to name it."""
    ok, msg, reported = compare(parquet_inputs, fmt, references, extra)
    t.check(ok, "%s: %s" % (what, msg))
    t.check(reported == nulls, "%s: %d nulls skipped and reported (%d)" % (what, nulls, reported))
    if not ok and len(parquet_inputs) > 1 and len(references) == len(parquet_inputs):
        for f, r in zip(parquet_inputs, references):
            alone, msg, _ = compare([f], fmt, [r], extra)
            t.check(alone, "%s: %s" % (os.path.basename(f), msg))


def refused(inputs, fmt, want, what, extra=()):
    out = path("refused.bin")
    p = prepare(inputs, fmt, out, extra)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    t.check(p.returncode != 0 and len(lines) == 1 and want in lines[0] and inputs[0] in lines[0]
            and not any(n.startswith("refused.bin") for n in os.listdir(D)),
            "%s: refused in one line naming the file, nothing written (%r)" % (what, p.stderr.strip()))


# ---- the texts, in every writer's encodings ----------------------------------------------------------
texts = pt.wikitext()
titles = pt.titles()
nulls = texts.count(None)
reference = write_jsonl("wikitext.jsonl", pt.jsonl_records(texts))
ids = list(range(len(texts)))
specs = []
for codec in ("UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD"):
    for dictionary in (False, True):
        specs.append(dict(file=path("hyparquet-%s-%s.parquet" % (codec, "dict" if dictionary else "plain")),
                          writer="hyparquet", codec=codec, dictionary=dictionary, page_v2=True, row_group=40,
                          page_size=60 if dictionary else 400, columns={"title": titles, "text": texts},
                          ints={"id": ids}))
for codec in ("UNCOMPRESSED", "SNAPPY", "GZIP"):
    for v2 in (False, True):
        specs.append(dict(file=path("parquetjs-%s-v%d.parquet" % (codec, 2 if v2 else 1)), writer="parquetjs",
                          codec=codec, page_v2=v2, row_group=40, columns={"title": titles, "text": texts},
                          ints={"id": ids}))
# Alpaca's columns, with null inputs and a null output
ins, inp, outs = pt.alpaca()
alpaca_nulls = sum(1 for o in outs if o is None)
alpaca_ref = write_jsonl("alpaca.jsonl", pt.alpaca_records(ins, inp, outs))
for writer, v2 in (("hyparquet", True), ("parquetjs", False)):
    specs.append(dict(file=path("alpaca-%s.parquet" % writer), writer=writer, codec="SNAPPY", dictionary=True,
                      page_v2=v2, row_group=16, columns={"instruction": ins, "input": inp, "output": outs}))
# Two files that are one corpus: the halves of the texts
half = len(texts) // 2
for k, part in enumerate((texts[:half], texts[half:])):
    specs.append(dict(file=path("part-%d.parquet" % k), writer="hyparquet", codec="GZIP", dictionary=k == 1,
                      page_v2=True, row_group=25, columns={"text": part}))
# Malformed: a codec fsdp.c does not read; one large page (above --max-memory 12's 192 KiB per document)
specs.append(dict(file=path("lz4.parquet"), writer="hyparquet", codec="LZ4_RAW", dictionary=False, page_v2=True,
                  row_group=40, columns={"text": texts}))
specs.append(dict(file=path("large-page.parquet"), writer="hyparquet", codec="UNCOMPRESSED", dictionary=False,
                  page_v2=True, row_group=1000, page_size=1 << 20, columns={"text": ["x" * 1000] * 300}))
write_parquet(specs)

# several pages per column chunk (400 bytes of values, or 60 of dictionary indices, a page)
same_tokens([s["file"] for s in specs[:14]], "parquet", [reference] * 14, 14 * nulls,
            "hyparquet-writer (v2 pages; none, Snappy, gzip, Zstd; dictionary on and off) and parquetjs-lite (v1 "
            "and v2 pages; none, Snappy, gzip)", ["--field", "text"])
same_tokens([s["file"] for s in specs[14:16]], "alpaca", [alpaca_ref] * 2, 2 * alpaca_nulls,
            "Alpaca columns (hyparquet-writer, parquetjs-lite)")
same_tokens([specs[16]["file"], specs[17]["file"]], "parquet", [reference], nulls, "one corpus in two files")
# --field picks another column; --val-fraction splits Parquet documents as JSON Lines ones
same_tokens([specs[1]["file"]], "parquet", [write_jsonl("titles.jsonl", [{"title": x} for x in titles])], 0,
            "--field title", ["--field", "title"])
same_tokens([specs[3]["file"]], "parquet", [reference], nulls, "--val-fraction 0.3",
            ["--field", "text", "--val-fraction", "0.3"])
t.check(open(path("from-parquet.val.bin"), "rb").read() == open(path("from-jsonl.val.bin"), "rb").read(),
        "--val-fraction: the same validation file")

# ---- files pyarrow wrote (committed to tests/data/parquet by the GPU host's gpu_parquet_files.py) ----
if os.path.exists(os.path.join(DATA, "manifest.json")):
    manifest = json.load(open(os.path.join(DATA, "manifest.json"), encoding="utf-8"))
    for fmt in ("parquet", "alpaca"):
        entries = [e for e in manifest["files"] if e["format"] == fmt]
        if entries:
            same_tokens([os.path.join(DATA, e["file"]) for e in entries], fmt,
                        [os.path.join(DATA, e["jsonl"]) for e in entries], sum(e["nulls"] for e in entries),
                        "pyarrow's %s" % ", ".join(e["file"] for e in entries),
                        ["--field", "text"] if fmt == "parquet" else [])
else:
    print("note: no tests/data/parquet (pyarrow's files): run tests/scripts/gpu_parquet_files.py on a host with pyarrow")

# ---- malformed inputs ------------------------------------------------------------------------------
good = open(specs[2]["file"], "rb").read()


def write_bytes(name, data):
    with open(path(name), "wb") as f:
        f.write(data)
    return path(name)


FIELD = ["--field", "text"]
refused([write_bytes("text.parquet", b"just some text, not Parquet at all\n")], "parquet",
        "not a Parquet file (no PAR1 magic at its start)", "bad magic", FIELD)
refused([write_bytes("cut.parquet", good[:len(good) // 2])], "parquet", "no PAR1 magic at its end", "truncated file",
        FIELD)
refused([write_bytes("footer.parquet", good[:-8] + (len(good)).to_bytes(4, "little") + b"PAR1")], "parquet",
        "truncated footer", "footer length past the file", FIELD)
refused([specs[18]["file"]], "parquet", "compressed with LZ4_RAW", "unsupported codec", FIELD)
refused([specs[2]["file"]], "parquet", 'column "id" is INT64, not text', "an INT64 column", ["--field", "id"])
refused([specs[2]["file"]], "parquet", 'no column "body" (--field); its columns: "title", "text", "id"',
        "a missing column", ["--field", "body"])
refused([specs[2]["file"]], "alpaca", 'no column "instruction"', "Alpaca without its columns")
refused([specs[19]["file"]], "parquet", "more than the 0.2 MiB --max-memory allows", "a page above the bound",
        FIELD + ["--max-memory", "12"])
# a page that does not decompress: flip bytes inside the first data page of a gzip file of one column
bad = bytearray(open(specs[16]["file"], "rb").read())
for i in range(300, 340):
    bad[i] ^= 0x5a
refused([write_bytes("corrupt.parquet", bytes(bad))], "parquet", "row group 1", "a corrupt page", FIELD)
t.finish()
