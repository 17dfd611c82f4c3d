"""fsdp train --tensorboard DIR, read by an independent reader written here (no TensorFlow): every record's
framing (length, masked CRC32C of the length and of the data, computed bit by bit here), the Event
protocol buffers decoded field by field (wall_time, step, file_version, Summary.Value tag and
simple_value), the file named events.out.tfevents.<10-digit time>.<host>, its first record
file_version "brain.Event:2", wall times that do not go back; and the scalars equal the --metrics JSON
Lines of the same run (every number of every step, evaluation and summary record, within float32's
rounding of the JSON's 10 digits). Two
ranks write one file (rank 0). A run with --tensorboard alone (no --metrics) writes the same scalars;
a resumed run adds a second file; a fresh run into a folder with event files is refused in one line;
a flipped byte is caught by the reader's CRC check (so the check can fail)."""
import json
import math
import os
import random
import re
import socket
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing

D = t.tmpdir("tensorboard")
FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: independent of fsdp.c's table."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(b, i):
    v, shift = 0, 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """(field number, wire type, value) of a protocol buffer message."""
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        out.append((num, wire, v))
    return out


def read_events(path):
    """The events of a file as dicts: wall_time, step, file_version or scalars {tag: value}."""
    data = open(path, "rb").read()
    i, events = 0, []
    while i < len(data):
        if len(data) - i < 12:
            raise ValueError("%s: a record cut short at byte %d" % (path, i))
        (n,) = struct.unpack_from("<Q", data, i)
        (lcrc,) = struct.unpack_from("<I", data, i + 8)
        if lcrc != masked(crc32c(data[i:i + 8])):
            raise ValueError("%s: length CRC wrong at byte %d" % (path, i))
        body = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, i + 12 + n)
        if len(body) != n or dcrc != masked(crc32c(body)):
            raise ValueError("%s: data CRC wrong at byte %d" % (path, i))
        i += 12 + n + 4
        ev = {"scalars": {}}
        for num, wire, v in fields(body):
            if num == 1 and wire == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif num == 2 and wire == 0:
                ev["step"] = v
            elif num == 3 and wire == 2:
                ev["file_version"] = v.decode()
            elif num == 5 and wire == 2:
                for snum, swire, value in fields(v):
                    assert snum == 1 and swire == 2
                    tag, simple = None, None
                    for vnum, vwire, x in fields(value):
                        if vnum == 1 and vwire == 2:
                            tag = x.decode()
                        elif vnum == 2 and vwire == 5:
                            simple = struct.unpack("<f", x)[0]
                    ev["scalars"][tag] = simple
        events.append(ev)
    return events


def close(got, want):
    """A float32 scalar of the JSON number: within half a float32 step of the value, plus the 10
    significant digits the JSON Lines keep."""
    return got is not None and abs(got - want) <= abs(want) * (2.0 ** -24 + 1e-9) + 1e-30


def differences(want, got):
    return {"missing": sorted(set(want) - set(got))[:5], "extra": sorted(set(got) - set(want))[:5],
            "different": [(k, want[k], got[k]) for k in want if k in got and not close(got[k], want[k])][:5]}


def same(want, got):
    return set(want) == set(got) and all(close(got[k], want[k]) for k in want)


def expected(records):
    """{(step, tag): value} from the metrics JSON Lines, by the rule of src/io/metrics.h."""
    out = {}
    for r in records:
        prefix = "summary" if r.get("summary") is True else "eval" if "eval_loss" in r else "train"
        step = r["final_step" if prefix == "summary" else "step"]
        for k, v in r.items():
            if k in ("step", "final_step"):
                continue
            name = k[5:] if prefix == "eval" and k.startswith("eval_") else k
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)):
                out[(step, "%s/%s" % (prefix, name))] = float(v)
            elif isinstance(v, dict):
                for s, w in v.items():
                    if isinstance(w, (int, float)) and not isinstance(w, bool):
                        out[(step, "%s/%s/%s" % (prefix, name, s))] = float(w)
    return out


def scalars(events):
    return {(e["step"], tag): v for e in events for tag, v in e["scalars"].items()}


def event_files(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("events.out.tfevents."))


rng = random.Random(3)
VOCAB = 990
docs = [[2] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(5, 40))] for _ in range(120)]
train_file, val_file = os.path.join(D, "train.bin"), os.path.join(D, "val.bin")
packing.write_v2(train_file, docs[:100], VOCAB)
packing.write_v2(val_file, docs[100:], VOCAB)
COMMON = ["train", "--model", "tiny-opt", "--data", train_file, "--eval-data", val_file, "--eval-every", "3",
          "--seq", "16", "--mbs", "2", "--lr", "3e-3", "--warmup", "2"] + FP32

# ---- two ranks, with --metrics: one file, the same numbers ------------------------------------------
tb, m, ckpt = os.path.join(D, "tb", "run1"), os.path.join(D, "m.jsonl"), os.path.join(D, "ckpt")
rc, out, err = t.run(2, COMMON + ["--steps", "6", "--metrics", m, "--tensorboard", tb, "--ckpt-dir", ckpt,
                                  "--ckpt-every", "3"])
files = event_files(tb) if rc == 0 else []
t.check(len(files) == 1 and os.listdir(tb) == [os.path.basename(files[0])],
        "two ranks write one event file (rank 0), made with its parent folder: %s" % (os.listdir(tb) if rc == 0 else err))
name = os.path.basename(files[0]) if files else ""
t.check(re.fullmatch(r"events\.out\.tfevents\.\d{10}\.%s" % re.escape(socket.gethostname()), name) is not None,
        "TensorFlow's file name events.out.tfevents.<time>.<host>: %s" % name)
events = read_events(files[0]) if files else []
t.check(bool(events) and events[0].get("file_version") == "brain.Event:2" and not events[0]["scalars"],
        "the first record is file_version brain.Event:2")
walls = [e["wall_time"] for e in events]
t.check(walls == sorted(walls) and all(abs(w - walls[0]) < 3600 for w in walls) and walls[0] > 1.6e9,
        "wall times are Unix times that do not go back")
records = [json.loads(l) for l in open(m)] if rc == 0 else []
want, got = expected(records), scalars(events[1:])
t.check(same(want, got) and len(want) > 6 * 10,
        "the scalars equal the metrics JSON Lines (%d values): %s" % (len(want), differences(want, got)))
for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s_per_gpu", "train/reserved_gib",
            "eval/loss", "eval/ppl", "summary/tokens_per_s_per_gpu", "summary/max_reserved_gib"):
    t.check(any(k[1] == tag for k in got), "tag %s is written" % tag)
t.check(sorted(k[0] for k in got if k[1] == "eval/loss") == [3, 6], "eval/loss at steps 3 and 6")
t.check(all(math.isfinite(v) for v in got.values()), "every scalar is finite")

# ---- a flipped byte is caught (the reader's CRC check can fail) ---------------------------------------
if files:
    data = bytearray(open(files[0], "rb").read())
    data[len(data) // 2] ^= 0x01
    bad = os.path.join(D, "flipped")
    open(bad, "wb").write(bytes(data))
    try:
        read_events(bad)
        t.fail("a flipped byte went unnoticed by the CRC check")
    except ValueError as e:
        t.check("CRC" in str(e), "a flipped byte fails the CRC check: %s" % e)

# ---- a fresh run into the same folder is refused; a resumed run adds a file -----------------------------
rc2, out2, err2 = t.run(1, COMMON + ["--steps", "6", "--tensorboard", tb], check=False)
lines = [l for l in err2.splitlines() if l.strip()]
t.check(rc2 != 0 and len(lines) == 1 and "--tensorboard" in lines[0] and "earlier run" in lines[0]
        and len(event_files(tb)) == 1, "a fresh run into a folder of event files is refused in one line: %r" % err2)
rc3, out3, err3 = t.run(2, COMMON + ["--steps", "9", "--tensorboard", tb, "--ckpt-dir", ckpt, "--resume", "auto",
                                     "--allow-schedule-change", "--metrics", m])
files = event_files(tb)
t.check(rc3 == 0 and len(files) == 2, "the resumed run adds a second event file: %s" % files)
if rc3 == 0 and len(files) == 2:
    newer = [f for f in files if f != os.path.join(tb, name)][0]
    ev2 = read_events(newer)
    records = [json.loads(l) for l in open(m)]
    resumed = [r for r in records if r.get("step", 0) > 6 or (r.get("summary") and r.get("final_step") == 9)]
    t.check(ev2[0].get("file_version") == "brain.Event:2" and same(expected(resumed), scalars(ev2[1:]))
            and sorted({k[0] for k in scalars(ev2[1:]) if k[1] == "train/loss"}) == [7, 8, 9],
            "the resumed run's file holds steps 7 to 9, equal to its metrics")

# ---- --tensorboard alone: the same losses as the run with --metrics ------------------------------------
tb2 = os.path.join(D, "tb-alone")
rc4, out4, err4 = t.run(2, COMMON + ["--steps", "6", "--tensorboard", tb2])
if rc4 == 0:
    alone = scalars(read_events(event_files(tb2)[0])[1:])
    first = {k: v for k, v in want.items() if k[1] in ("train/loss", "train/grad_norm", "eval/loss")}
    t.check(all(close(alone.get(k), v) for k, v in first.items()),
            "--tensorboard without --metrics: the same losses: %s" % differences(first, alone))
t.finish()
