"""Checks of what `fsdp report` writes: its Markdown tables against the metrics files they came from,
and its PNGs decoded (header, size, pixels). Used by tests/scripts/report.py and slurm_sweeps.py."""
import json
import os
import re
import struct
import zlib

import fsdptest as t


# ---- metrics ----

def summary_of(path):
    """The last summary record of a metrics file."""
    last = None
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("summary"):
                last = rec
    return last


def runs_under(root):
    """{run folder relative to root's parent: summary} for every metrics.jsonl under root."""
    base = os.path.dirname(os.path.abspath(root))
    out = {}
    for d, _, files in os.walk(root):
        if "metrics.jsonl" in files:
            out[os.path.relpath(d, base)] = summary_of(os.path.join(d, "metrics.jsonl"))
    return out


def thousands(x):
    return "{:,.0f}".format(x)


def gib(x):
    return "%.2f" % x if x >= 1 or x == 0 else "%.3g" % x


def gpu_hours(tps):
    return 1e9 / (tps * 3600.0)


# ---- Markdown ----

# A report of CPU runs only names its columns per rank (tokens/s/rank, ranks, rank-hours): the checks
# below compare values under the GPU names, so both spellings read as one.
RANK_COLUMNS = {"tokens/s/rank": "tokens/s/GPU", "ranks": "GPUs", "rank-hours per 1e9 tokens": "GPU-hours per 1e9 tokens",
                "TFLOP/s/rank": "TFLOP/s/GPU"}


def sections(md):
    """{'## heading': [table, ...]} where a table is a list of {column: cell} rows (rank columns under
    their GPU names)."""
    out, heading, table, header = {}, None, None, None
    for line in md.splitlines():
        if line.startswith("#"):
            heading, table, header = line.strip(), None, None
            out.setdefault(heading, [])
            continue
        if not line.startswith("|"):
            table, header = None, None
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if header is None:
            header = [RANK_COLUMNS.get(c, c) for c in cells]
            table = []
            out.setdefault(heading, []).append(table)
        elif all(set(c) <= set("-") for c in cells):
            continue
        else:
            table.append(dict(zip(header, cells)))
    return out


def section(md, prefix):
    """The tables of the first section whose heading starts with prefix ([] when none)."""
    for heading, tables in sections(md).items():
        if heading.startswith(prefix):
            return tables
    return []


# ---- PNG ----

def _unfilter(raw, width, height, bpp):
    stride = width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        kind = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return rows


def png_info(path):
    """(width, height, distinct colours, share of pixels that are not the background) of an 8-bit
    RGB or RGBA PNG; raises ValueError when the file is not one."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG signature")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]:
            raise ValueError("bad CRC in chunk %r" % kind)
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in (2, 6):
                raise ValueError("unexpected PNG format: depth %d, colour type %d" % (depth, colour))
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    if width is None:
        raise ValueError("no IHDR chunk")
    rows = _unfilter(zlib.decompress(idat), width, height, bpp)
    counts = {}
    for row in rows[::2]:  # every other row is enough to count colours and ink
        for x in range(0, len(row), bpp * 2):
            px = row[x:x + 3]
            counts[px] = counts.get(px, 0) + 1
    background = max(counts, key=counts.get)
    total = sum(counts.values())
    return width, height, len(counts), 1.0 - counts[background] / total


def check_png(path, what, min_width=600, min_height=400):
    """A real plot: a PNG of a plot's size with axes, text and coloured data on it."""
    try:
        w, h, colours, ink = png_info(path)
    except (OSError, ValueError, zlib.error) as e:
        t.fail("%s: %s is not a valid PNG: %s" % (what, path, e))
        return
    t.check(w >= min_width and h >= min_height and colours >= 8 and 0.01 <= ink <= 0.6,
            "%s: %s is a %dx%d PNG with %d colours and %.1f%% ink" % (what, os.path.basename(path), w, h, colours,
                                                                        100 * ink))


def check_images(md, out_dir, what):
    """Every image report.md names exists as a valid PNG, and every PNG written is named."""
    named = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    written = sorted(f for f in os.listdir(out_dir) if f.endswith(".png"))
    t.check(sorted(named) == written, "%s: report.md shows every plot written (%s)" % (what, ", ".join(written)))
    for name in written:
        check_png(os.path.join(out_dir, name), what)
    return named


# ---- the tables against the metrics ----

def check_ladder(md, runs, folder, what):
    """The ladder's rows are the folder's rungs in rung order, with their numbers."""
    tables = section(md, "## Ladder")
    rows = [r for table in tables for r in table]
    mine = sorted((name for name in runs if name.startswith(folder + "/")), key=lambda n: os.path.basename(n))
    t.check([r["run"] for r in rows] == [os.path.basename(n) for n in mine],
            "%s: the ladder has one row per rung, in rung order (%d)" % (what, len(mine)))
    base = runs[mine[0]]["tokens_per_s_per_gpu"]
    bad = []
    for r, name in zip(rows, mine):
        s = runs[name]
        want = {"MBS": str(s["mbs"]), "model precision": s["model_precision"], "mixed precision": s["mixed_precision"],
                "attention": s["attn"], "tokens/s/GPU": thousands(s["tokens_per_s_per_gpu"]),
                "speed-up": "%.2fx" % (s["tokens_per_s_per_gpu"] / base), "max reserved GiB": gib(s["max_reserved_gib"]),
                "GPU-hours per 1e9 tokens": "%.2f" % gpu_hours(s["tokens_per_s_per_gpu"])}
        bad += ["%s %s: %r != %r" % (name, k, r.get(k), v) for k, v in want.items() if r.get(k) != v]
    t.check(not bad, "%s: every ladder cell matches its run's summary %s" % (what, bad[:3]))
    return rows


def check_strategies(md, runs, folder, what):
    rows = [r for table in section(md, "## Sharding strategies") for r in table]
    mine = {os.path.basename(n): runs[n] for n in runs if n.startswith(folder + "/")}
    order = [r["strategy"] for r in rows]
    t.check(order == ["FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID"],
            "%s: one row per strategy, FULL first (%s)" % (what, ", ".join(order)))
    base = next(s for s in mine.values() if s["strategy"] == "FULL")["tokens_per_s_per_gpu"]
    bad = []
    for r in rows:
        s = mine.get(r["run"])
        if s is None:
            bad.append("unknown run %s" % r["run"])
            continue
        want = {"strategy": s["strategy"], "tokens/s/GPU": thousands(s["tokens_per_s_per_gpu"]),
                "total tokens/s": thousands(s["tokens_per_s_per_gpu"] * s["world_size"]),
                "relative": "%.2fx" % (s["tokens_per_s_per_gpu"] / base), "max reserved GiB": gib(s["max_reserved_gib"])}
        bad += ["%s %s: %r != %r" % (r["run"], k, r.get(k), v) for k, v in want.items() if r.get(k) != v]
    t.check(not bad and len(rows) == len(mine), "%s: every strategy cell matches its run's summary %s" % (what, bad[:3]))
    return rows


def check_scaling(md, runs, folder, what, price=None):
    rows = [r for table in section(md, "## Scaling") for r in table]
    mine = sorted((runs[n] for n in runs if n.startswith(folder + "/")), key=lambda s: s["world_size"])
    t.check([int(r["GPUs"]) for r in rows] == [s["world_size"] for s in mine],
            "%s: one scaling row per GPU count (%s)" % (what, ", ".join(r["GPUs"] for r in rows)))
    base = mine[0]["tokens_per_s_per_gpu"]
    bad = []
    for r, s in zip(rows, mine):
        tps = s["tokens_per_s_per_gpu"]
        want = {"nodes": str(s["nodes"]), "tokens/s/GPU": thousands(tps), "total tokens/s": thousands(tps * s["world_size"]),
                "speed-up": "%.2fx" % (tps * s["world_size"] / base), "efficiency": "%.1f%%" % (100 * tps / base),
                "global batch": str(s["mbs"] * s["world_size"] * s["grad_accum"]),
                "GPU-hours per 1e9 tokens": "%.2f" % gpu_hours(tps)}
        if price:
            want["EUR per 1e9 tokens"] = "%.2f" % (gpu_hours(tps) * price)
        bad += ["%d GPUs %s: %r != %r" % (s["world_size"], k, r.get(k), v) for k, v in want.items() if r.get(k) != v]
    t.check(not bad, "%s: every scaling cell matches its run's summary %s" % (what, bad[:3]))
    return rows
