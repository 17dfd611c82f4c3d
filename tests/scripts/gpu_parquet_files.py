"""Parquet files written by pyarrow, for fsdp prepare's reader (run where pyarrow is: the GPU host).

  python3 tests/scripts/gpu_parquet_files.py OUT_DIR   # writes the set into OUT_DIR (commit it as tests/data/parquet)
  ctest -R gpu_parquet_files                            # the test: SKIPPED without pyarrow

The set (each < 10 KB, the whole < 200 KB): the WikiText-shaped text column of tests/lib/parquet_texts.py
(nulls, empty lines, several row groups) in every codec pyarrow and fsdp.c share (none, Snappy, gzip,
Zstd), dictionary on and off, data pages v1 and v2, PLAIN_DICTIONARY (format 1.0) and large_string; a
file shaped as Hugging Face's WikiText (one `text` column, empty lines, Snappy, several row groups); Alpaca
columns with null inputs; manifest.json and the expected texts as JSON Lines (nulls left out), which
tests/scripts/parquet.py compares with fsdp prepare's reading on every CPU run.

As a test it writes the set into a temporary folder and checks that (1) pyarrow reads back exactly the
texts (the expected files are right), (2) fsdp prepare's token files from each Parquet file equal those
from its JSON Lines, and (3) when tests/data/parquet is committed, its expected texts are what pyarrow
reads from its Parquet files."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import parquet_texts as pt

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:
    print("gpu_parquet_files: SKIPPED (needs pyarrow)")
    sys.exit(77)


def write_set(out):
    os.makedirs(out, exist_ok=True)
    texts = pt.wikitext()
    files = []

    def jsonl(name, records):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        return name

    wiki = jsonl("wikitext.jsonl", pt.jsonl_records(texts))
    nulls = texts.count(None)
    # an INT64 column before the text: the reader must find the text's column among the leaves
    table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": pa.array(texts, pa.string())})
    for codec in ("NONE", "SNAPPY", "GZIP", "ZSTD"):
        for dictionary in (False, True):
            for page in ("1.0", "2.0"):
                name = "%s-%s-v%s.parquet" % (codec.lower(), "dict" if dictionary else "plain", page[0])
                pq.write_table(table, os.path.join(out, name), compression=codec, use_dictionary=dictionary,
                               data_page_version=page, row_group_size=40, data_page_size=1024)
                files.append(dict(file=name, format="parquet", field="text", nulls=nulls, jsonl=wiki))
    # format 1.0 writes PLAIN_DICTIONARY (not RLE_DICTIONARY) pages
    pq.write_table(table, os.path.join(out, "plain-dictionary-format-1.parquet"), version="1.0", use_dictionary=True,
                   row_group_size=64)
    files.append(dict(file="plain-dictionary-format-1.parquet", format="parquet", field="text", nulls=nulls, jsonl=wiki))
    large = pa.table({"text": pa.array(texts, pa.large_string())})
    pq.write_table(large, os.path.join(out, "large-string.parquet"), compression="ZSTD", row_group_size=50)
    files.append(dict(file="large-string.parquet", format="parquet", field="text", nulls=nulls, jsonl=wiki))
    # Hugging Face's WikiText: one text column, empty lines, no nulls, Snappy, several row groups
    hf = [x if x is not None else "" for x in texts]
    pq.write_table(pa.table({"text": pa.array(hf, pa.string())}), os.path.join(out, "wikitext-shaped.parquet"),
                   row_group_size=60)
    files.append(dict(file="wikitext-shaped.parquet", format="parquet", field="text", nulls=0,
                      jsonl=jsonl("wikitext-shaped.jsonl", pt.jsonl_records(hf))))
    ins, inp, outs = pt.alpaca()
    pq.write_table(pa.table({"instruction": ins, "input": pa.array(inp, pa.string()), "output": outs}),
                   os.path.join(out, "alpaca.parquet"), row_group_size=16)
    files.append(dict(file="alpaca.parquet", format="alpaca", field=None, nulls=sum(o is None for o in outs),
                      jsonl=jsonl("alpaca.jsonl", pt.alpaca_records(ins, inp, outs))))
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"written_by": "pyarrow %s (tests/scripts/gpu_parquet_files.py)" % pa.__version__, "files": files},
                  f, indent=1)
    return files


def check_set(folder, files, what):
    """pyarrow reads back the expected texts of every file."""
    for e in files:
        got = pq.read_table(os.path.join(folder, e["file"])).to_pylist()
        want = [json.loads(l) for l in open(os.path.join(folder, e["jsonl"]), encoding="utf-8")]
        if e["format"] == "parquet":
            rows = [{e["field"]: r[e["field"]]} for r in got if r[e["field"]] is not None]
        else:
            rows = pt.alpaca_records([r["instruction"] for r in got], [r["input"] for r in got],
                                     [r["output"] for r in got])
        t.check(rows == want, "%s %s: pyarrow reads the expected texts" % (what, e["file"]))


if len(sys.argv) > 1:
    files = write_set(sys.argv[1])
    total = sum(os.path.getsize(os.path.join(sys.argv[1], f)) for f in os.listdir(sys.argv[1]))
    print("wrote %d Parquet files and their texts into %s (%d bytes)" % (len(files), sys.argv[1], total))
    sys.exit(0)

D = t.tmpdir("gpu_parquet_files")
files = write_set(D)
check_set(D, files, "fresh")
from tokfixtures import fixtures  # noqa: E402  (only the test needs the tokenizer)

LLAMA2 = os.path.join(fixtures(), "llama2", "tokenizer.json")
for e in files:
    outs = []
    for src, fmt in ((e["file"], e["format"]), (e["jsonl"], "jsonl" if e["format"] == "parquet" else "alpaca")):
        out = os.path.join(D, "%d.bin" % len(outs))
        args = [t.BIN, "prepare", "--quiet", "--threads", "1", "--tokenizer", LLAMA2, "--input", os.path.join(D, src),
                "--format", fmt, "--out", out] + (["--field", e["field"]] if e["field"] else [])
        p = subprocess.run(args, capture_output=True, text=True, env=t.ENV, timeout=600)
        t.check(p.returncode == 0, "prepare %s (%s): %s" % (src, fmt, p.stderr.strip()))
        outs.append(open(out, "rb").read() if p.returncode == 0 else None)
    t.check(outs[0] is not None and outs[0] == outs[1], "%s: the token file equals the one from JSON Lines" % e["file"])
committed = os.path.join(t.ROOT, "tests", "data", "parquet")
if os.path.exists(os.path.join(committed, "manifest.json")):
    check_set(committed, json.load(open(os.path.join(committed, "manifest.json")))["files"], "committed")
t.finish()
