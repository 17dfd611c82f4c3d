"""Texts for the Parquet tests (tests/scripts/parquet.py, tests/scripts/gpu_parquet_files.py): a
WikiText-shaped column (headings, paragraphs, empty lines, repeated lines so that dictionaries pay),
with nulls, non-ASCII text, tabs and CRLF, and Alpaca records with null inputs and one null output.
Deterministic: the same lists on every machine."""
import random

WORDS = ("the of and in to a was is for on as by with at from his that it an were are which this be or has had "
         "first new one their after its also who but two been they not her have she all other time into during "
         "naïve café résumé Zürich 東京 中文 😀 — “quoted” 3.14 1,024 @-@").split()


def wikitext(rows=150, seed=7):
    """(texts, nulls): `rows` values of a text column; None is a null."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        r = rng.random()
        if i % 17 == 3:
            out.append(None)
        elif r < 0.25:
            out.append("")
        elif r < 0.35:
            out.append(" = %s = \n" % rng.choice(["Valkyria Chronicles III", "Gameplay", "Plot", "Reception"]))
        elif r < 0.42:
            out.append(" = = Development = = \n")
        else:
            n = rng.randint(2, 20)
            words = " ".join(rng.choice(WORDS) for _ in range(n))
            tail = rng.choice([" \n", "\n", "\r\n", "\tend\n", ""])
            out.append(" " + words + " ." + tail)
    return out


def titles(rows=150, seed=11):
    """A second string column (the reader must pick --field's column, not the first)."""
    rng = random.Random(seed)
    return ["title %d %s" % (i, rng.choice(WORDS)) for i in range(rows)]


def alpaca(rows=40, seed=5):
    """Columns instruction, input, output: inputs null or empty at times, one output null (skipped)."""
    rng = random.Random(seed)
    ins, inp, outs = [], [], []
    for i in range(rows):
        ins.append("Instruction %d: %s" % (i, " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))))
        r = rng.random()
        inp.append(None if r < 0.3 else "" if r < 0.5 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))))
        outs.append(None if i == 7 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))))
    return ins, inp, outs


def jsonl_records(texts, field="text"):
    """The JSON Lines records equal to a text column: nulls left out (prepare skips and counts them)."""
    return [{field: t} for t in texts if t is not None]


def alpaca_records(ins, inp, outs):
    """The Alpaca JSON records equal to the columns: a null output's record left out, a null input absent."""
    recs = []
    for a, b, c in zip(ins, inp, outs):
        if a is None or c is None:
            continue
        rec = {"instruction": a, "output": c}
        if b is not None:
            rec["input"] = b
        recs.append(rec)
    return recs
