"""How a token file becomes samples, written in Python from docs/FORMATS.md ("Samples") and sharing
nothing with fsdp.c: the tests' independent side of every packing comparison. Also writers of
synthetic token files (versions 1 and 2, with masks and empty documents).

MISTAKES are deliberately wrong packers: a test that compares fsdp.c with this module runs them too
and requires each to disagree, which proves the comparison would notice such a bug."""
import math
import struct

MISTAKES = {
    "no_eos": "stream: documents joined without EOS",
    "always_eos": "stream: EOS after every document, even one that ends with EOS or precedes one that starts with it",
    "count_masked": "the loss mask ignored: every token counts",
    "count_padding": "pad: padded positions count (predicting the pad id)",
}


def write_v1(path, ids, vocab):
    wide = vocab > 65536
    with open(path, "wb") as f:
        f.write(b"FSDPTOK\0" + struct.pack("<IIQQ", 1, 4 if wide else 2, len(ids), vocab) + bytes(32))
        f.write(struct.pack("<%d%s" % (len(ids), "I" if wide else "H"), *ids))


def write_v2(path, docs, vocab, masks=None, tok_hash=0):
    """docs: lists of ids (an empty list is an empty document); masks: one 0/1 list per document."""
    ids = [t for d in docs for t in d]
    starts = [0]
    for d in docs:
        starts.append(starts[-1] + len(d))
    wide = vocab > 65536
    with open(path, "wb") as f:
        f.write(b"FSDPTOK\0" + struct.pack("<IIQQQQI", 2, 4 if wide else 2, len(ids), vocab, len(docs), tok_hash,
                                           1 if masks else 0) + bytes(12))
        f.write(struct.pack("<%d%s" % (len(ids), "I" if wide else "H"), *ids))
        f.write(struct.pack("<%dQ" % len(starts), *starts))
        if masks:
            bits = [b for m in masks for b in m]
            packed = bytearray((len(bits) + 7) // 8)
            for i, b in enumerate(bits):
                if b:
                    packed[i // 8] |= 1 << (i % 8)
            f.write(bytes(packed))


def documents(tok):
    """[(ids, mask)] of a tokfixtures.read_tokens() dict (mask all ones without one)."""
    s, ids, mask = tok["documents"], tok["ids"], tok["mask"]
    return [(ids[s[d]:s[d + 1]], mask[s[d]:s[d + 1]] if mask else [1] * (s[d + 1] - s[d])) for d in range(len(s) - 1)]


def stream(tok, eos, mistake=None):
    """(ids, counts) of the stream: a version 1 file as it is; version 2 documents joined with one EOS
    after each non-empty document unless it ends with EOS or the next non-empty one starts with it."""
    if tok["version"] == 1:
        return list(tok["ids"]), [1] * len(tok["ids"])
    docs = [d for d in documents(tok) if d[0]]
    ids, counts = [], []
    for k, (d, m) in enumerate(docs):
        ids += d
        counts += m
        ends = d[-1] == eos
        next_starts = k + 1 < len(docs) and docs[k + 1][0][0] == eos
        insert = {"no_eos": False, "always_eos": True}.get(mistake, not ends and not next_starts)
        if insert:
            ids.append(eos)
            counts.append(1)
    return ids, counts


def _row(toks, mask, seq, pad, mistake):
    n = len(toks)
    inputs = [toks[i] if i < n else pad for i in range(seq)]
    labels = []
    for i in range(seq):
        if i + 1 < n:
            labels.append(toks[i + 1] if mask[i + 1] or mistake == "count_masked" else -1)
        else:
            labels.append(pad if mistake == "count_padding" else -1)
    return inputs, labels


def eval_samples(tok, packing, seq, eos, pad, mistake=None):
    """(inputs, labels) lists of rows, as an evaluation visits them: every stream window of seq + 1
    tokens at multiples of seq (the last one shorter when the stream ends inside it), or every
    document as one example truncated to seq + 1 tokens; labels -1 where nothing counts."""
    rows_in, rows_lab = [], []
    if packing == "pad":
        for d, m in documents(tok):
            i, l = _row(d[:seq + 1], m[:seq + 1], seq, pad, mistake)
            rows_in.append(i)
            rows_lab.append(l)
        return rows_in, rows_lab
    ids, counts = stream(tok, eos, mistake)
    for w in range(math.ceil((len(ids) - 1) / seq)):
        a = w * seq
        i, l = _row(ids[a:a + seq + 1], counts[a:a + seq + 1], seq, pad, mistake)
        rows_in.append(i)
        rows_lab.append(l)
    return rows_in, rows_lab
