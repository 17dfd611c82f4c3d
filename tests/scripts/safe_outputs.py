"""Outputs that never destroy inputs, and exports that are locked and atomic (issue 21, items 1-3 and 13-15):
  1. an output that is an input (the same name, a symbolic link, a hard link, a file of an input
     directory) is refused with exit status 2 and one line naming both flags, and the input's bytes
     are unchanged: train --metrics over --data, over the model's config.json, over --eval-data, over
     a --ckpt-dir file and over an --init-from directory's file; --ckpt-dir's files over --data; eval
     --metrics over --data; prepare --out over --tokenizer, over an --input through a link, and its
     temporary over an --input; export --out over the config it exports; tokenize's and generate's
     standard output over what they read;
  2. two exports started at once into one --out: one fails at once naming the directory and the
     other's pid, the other's files hold exactly its model;
  3. export --force killed with SIGKILL while writing, with the new model complete beside --out,
     after the switch, and between renames (strace delays each rename): --out loads and is entirely
     one model, the old or the new;
  14. SIGTERM and SIGINT during an export remove what it wrote; what a SIGKILL left is removed by the
     next export into --out, whatever its shard plan;
  13. prepare --max-memory: a document it accepts stays within the bound (peak RSS), a larger one is
     refused;
  15. --val-fraction that leaves the training file empty is refused, nothing written; eval --seq
     beyond max_position_embeddings names only flags eval takes, and eval --allow-longer-seq runs."""
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing
import safetensors_np as st
from tokfixtures import fixtures

D = t.tmpdir("safe-outputs")
ASAN = "ASAN_OPTIONS" in os.environ


def path(*names):
    return os.path.join(D, *names)


def md5(p):
    if not os.path.exists(p):
        return "missing"
    with open(p, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def command(nprocs, args):
    cmd = ([t.MPIRUN, "-np", str(nprocs)] if nprocs > 1 else []) + [t.BIN] + list(args)
    if args[0] in ("train", "eval") and "--device" not in args:
        cmd += ["--device", "cpu"]
    return cmd


def fsdp_lines(text):
    return [l for l in text.splitlines() if l.startswith("fsdp:")]


PRECIOUS = []  # every input the checks below use: restored after a check that damaged one


def refused(what, nprocs, args, needles, guarded, status=2, stdin=None, stdout=None, absent=(), timeout=120):
    """The command exits with `status` and one line naming every needle; the guarded files (and every
    other input of the test) keep their bytes and the paths in `absent` are not created."""
    guarded = sorted(set(guarded) | set(PRECIOUS))
    before = {g: md5(g) for g in guarded}
    saved = {g: open(g, "rb").read() for g in guarded}
    try:
        p = subprocess.run(command(nprocs, args), env=t.ENV, stdin=stdin, stdout=stdout or subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        t.fail("%s: timed out" % what)
        return
    lines = fsdp_lines(p.stderr)
    changed = [g for g in guarded if md5(g) != before[g]]
    for g in changed:  # back into the same inode, so that the links to it stay links to it
        with open(g, "r+b" if os.path.exists(g) else "wb") as f:
            f.write(saved[g])
            f.truncate()
    made = [a for a in absent if os.path.exists(a)]
    ok = (p.returncode == status and len(lines) == 1 and lines[0].startswith("fsdp: error:") and
          all(n in lines[0] for n in needles) and not changed and not made)
    t.check(ok, "%s -> exit %d, %r; changed %s, created %s" % (what, p.returncode, lines or p.stderr[-400:],
                                                                [os.path.basename(c) for c in changed], made))


# ---- 1. an output that names an input ---------------------------------------------------------------
VOCAB = 1031  # tiny-llama's
rng = random.Random(1)
data = path("d.bin")
packing.write_v1(data, [rng.randrange(VOCAB) for _ in range(4000)], VOCAB)
evald = path("e.bin")
packing.write_v1(evald, [rng.randrange(VOCAB) for _ in range(2000)], VOCAB)
config = path("config.json")
json.dump({"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 48, "intermediate_size": 88,
           "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
           "max_position_embeddings": 256, "tie_word_embeddings": True}, open(config, "w"))
PRECIOUS += [data, evald, config]
os.symlink(data, path("link.bin"))
os.link(data, path("hard.bin"))
TRAIN = ["train", "--model", "tiny-llama", "--data", data, "--steps", "1", "--seq", "16", "--mbs", "1"]

refused("train --metrics naming --data", 1, TRAIN + ["--metrics", data], ["--metrics", "--data", data], [data])
refused("train --metrics naming the model's config.json", 1,
        ["train", "--model", config, "--data", data, "--steps", "1", "--seq", "16", "--metrics", config],
        ["--metrics", "--model", config], [config])
refused("train --metrics naming --eval-data (2 ranks)", 2, TRAIN + ["--eval-data", evald, "--metrics", evald],
        ["--metrics", "--eval-data", evald], [evald, data])
refused("train --metrics through a symbolic link to --data", 1, TRAIN + ["--metrics", path("link.bin")],
        ["--metrics", "--data", "link.bin", "a link"], [data])
refused("train --metrics on a hard link of --data", 1, TRAIN + ["--metrics", path("hard.bin")],
        ["--metrics", "--data", "hard.bin"], [data])

ck = path("ck")
t.run(1, TRAIN + ["--ckpt-dir", ck])
latest = os.path.join(ck, "latest")
refused("train --metrics naming --ckpt-dir's latest on --resume auto", 1,
        TRAIN + ["--ckpt-dir", ck, "--resume", "auto", "--metrics", latest],
        ["--metrics", "--ckpt-dir", "latest"], [latest] + glob.glob(os.path.join(ck, "step-*.h5")))
step_file = sorted(glob.glob(os.path.join(ck, "step-*.h5")))[-1]
refused("train --data a step file --ckpt-dir replaces and prunes", 1,
        ["train", "--model", "tiny-llama", "--data", step_file, "--steps", "1", "--ckpt-dir", ck, "--overwrite"],
        ["--ckpt-dir", "--data", os.path.basename(step_file)], [step_file, latest])

hf = path("hf")
t.run(1, ["export", "--model", "tiny-llama", "--out", hf])
hf_config, hf_weights = os.path.join(hf, "config.json"), os.path.join(hf, "model.safetensors")
PRECIOUS += [hf_config, hf_weights]
refused("train --metrics naming a file of the --init-from directory", 1,
        ["train", "--init-from", hf, "--data", data, "--steps", "1", "--seq", "16", "--metrics", hf_config],
        ["--metrics", "--init-from", "config.json"], [hf_config, hf_weights])
refused("eval --metrics naming --data (2 ranks)", 2,
        ["eval", "--init-from", hf, "--data", data, "--seq", "16", "--metrics", data], ["--metrics", "--data"],
        [data])
refused("export --out replacing the config.json it exports", 1,
        ["export", "--model", hf_config, "--out", hf, "--force"], ["--out", "--model", "config.json"],
        [hf_config, hf_weights])

FX = fixtures()
LLAMA2 = os.path.join(FX, "llama2", "tokenizer.json")
tok = path("tokenizer.json")
shutil.copy(LLAMA2, tok)
text = path("in.txt")
with open(text, "w") as f:
    f.write("A first paragraph.\n\nA second one, with more words.\n\nAnd a third.\n")
PRECIOUS += [tok, text]
refused("prepare --out naming --tokenizer", 1, ["prepare", "--tokenizer", tok, "--input", text, "--out", tok],
        ["--out", "--tokenizer", tok], [tok])
os.symlink(text, path("text-link.bin"))
refused("prepare --out a link to an --input", 1,
        ["prepare", "--tokenizer", tok, "--input", text, "--out", path("text-link.bin")], ["--out", "--input"],
        [text])
shutil.copy(text, path("x.bin.tmp"))
refused("prepare --input naming --out's temporary", 1,
        ["prepare", "--tokenizer", tok, "--input", path("x.bin.tmp"), "--out", path("x.bin")],
        ["--out's temporary", "--input", "x.bin.tmp"], [path("x.bin.tmp")], absent=[path("x.bin")])
with open(tok, "ab") as out, open(text) as inp:
    refused("tokenize >> --tokenizer", 1, ["tokenize", "--tokenizer", tok], ["standard output", "--tokenizer"],
            [tok], stdin=inp, stdout=out, timeout=20)
with open(text, "ab") as out, open(text) as inp:
    refused("tokenize < f >> f", 1, ["tokenize", "--tokenizer", tok], ["standard output", "standard input"],
            [text], stdin=inp, stdout=out, timeout=20)
with open(hf_config, "ab") as out:
    refused("generate >> the model's config.json", 1,
            ["generate", "--init-from", hf, "--prompt-ids", "1 2", "--print-ids", "--max-new-tokens", "2"],
            ["standard output", "--init-from", "config.json"], [hf_config], stdout=out)


# ---- models to export, and how to tell them apart ---------------------------------------------------
def load(d):
    """{name: float32 array} of a model directory, read as a loader would: the index, else model.safetensors."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    out = {}
    for f in files:
        tensors, _, _, _ = st.read(os.path.join(d, f))
        out.update({k: st.to_f32(dt, a) for k, (dt, _, a) in tensors.items()})
    return out


def which(d, refs):
    """The name of the reference model d holds entirely, or why it holds none."""
    try:
        got = load(d)
        cfg = json.load(open(os.path.join(d, "config.json")))
    except Exception as e:  # noqa: BLE001 -- any failure to load is the finding
        return "unloadable (%s)" % e
    for name, ref in refs.items():
        if set(got) == set(ref) and all(np.array_equal(got[k], ref[k]) for k in ref) and cfg == refs_cfg[name]:
            return name
    return "a mix (%d tensors of A, %d of B)" % tuple(
        sum(k in r and np.array_equal(got[k], r[k]) for k in got) for r in (refs["A"], refs["B"]))


def leftovers(out):
    """What exports left beside and inside --out: staging directories, temporaries, a lock."""
    parent, base = os.path.split(out.rstrip("/"))
    beside = [n for n in os.listdir(parent) if n.startswith(base + ".") and n != base]
    inside = [n for n in os.listdir(out) if n.endswith(".tmp") or n.startswith(".fsdp")] if os.path.isdir(out) else []
    return beside + inside


def stop_group(p):
    """SIGKILL to a process group started with start_new_session (it may have ended already)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


SHARDS = ["--dtype", "fp32", "--max-shard-size", "100KB"]  # tiny-llama in 4 files
refs_dir = {"A": path("ref-a"), "B": path("ref-b")}
t.run(1, ["export", "--model", "tiny-llama", "--seed", "1", "--out", refs_dir["A"]] + SHARDS)
t.run(1, ["export", "--model", "tiny-llama", "--seed", "2", "--out", refs_dir["B"]] + SHARDS)
refs = {k: load(v) for k, v in refs_dir.items()}
refs_cfg = {k: json.load(open(os.path.join(v, "config.json"))) for k, v in refs_dir.items()}
t.check(len(glob.glob(os.path.join(refs_dir["A"], "*.safetensors"))) >= 3 and
        any(not np.array_equal(refs["A"][k], refs["B"][k]) for k in refs["A"]),
        "two different models of several files each (A: seed 1, B: seed 2)")
PIECES = len(refs["A"])  # rank 0 of 2 reads one piece of every tensor
OUT = path("out")


def export(seed, extra=(), env=None, nprocs=2, out=OUT):
    cmd = command(nprocs, ["export", "--model", "tiny-llama", "--seed", str(seed), "--out", out, "--force"] +
                  SHARDS + list(extra))
    return subprocess.run(cmd, env=dict(t.ENV, **(env or {})), capture_output=True, text=True, timeout=120)


# ---- 3. export --force killed at every stage --------------------------------------------------------
for point, expect in ((1, "A"), (PIECES // 2, "A"), (PIECES + 1, "A"), (PIECES + 2, "B")):
    p = export(1)
    ok = p.returncode == 0 and which(OUT, refs) == "A" and not leftovers(OUT)
    t.check(ok, "--out holds model A, nothing else%s" % ("" if ok else ": %s %s" % (p.stderr[-300:], leftovers(OUT))))
    p = export(2, env={"FSDP_TEST_FAIL": "0:%d:kill" % point})
    got = which(OUT, refs)
    t.check(p.returncode != 0 and got == expect,
            "export of B killed at point %d of %d (%s): --out is entirely model %s (%s)" %
            (point, PIECES + 2, "reading" if point <= PIECES else "before the switch" if point == PIECES + 1 else
             "after the switch", expect, got))

# Between renames: strace holds every rename for 0.3 s; the export is killed at the first change of
# --out's model files. A switch file by file shows a mix there; one rename shows all of B.
def strace_works():
    """strace may be installed where ptrace is not allowed (some containers): then it fails at once."""
    if not shutil.which("strace"):
        return False
    return subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"], capture_output=True).returncode == 0


if strace_works():
    traced = dict(t.ENV)
    if ASAN:  # LeakSanitizer's exit-time check needs ptrace, which strace holds
        traced["ASAN_OPTIONS"] = traced["ASAN_OPTIONS"] + ":detect_leaks=0"
    export(1)
    model_files = lambda: {n: os.stat(os.path.join(OUT, n)).st_ino for n in os.listdir(OUT)  # noqa: E731
                           if n.endswith(".safetensors") or n.endswith(".json")}
    start = model_files()
    cmd = ["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=rename,renameat,renameat2", "-e",
           "inject=rename,renameat,renameat2:delay_exit=300000"] + command(1, ["export", "--model", "tiny-llama",
                                                                              "--seed", "2", "--out", OUT,
                                                                              "--force"] + SHARDS)
    p = subprocess.Popen(cmd, env=traced, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, changed = time.time() + 90, False
    while time.time() < deadline and p.poll() is None and not changed:
        try:
            changed = model_files() != start
        except FileNotFoundError:  # --out renamed away for a moment
            changed = True
        time.sleep(0.01)
    stop_group(p)
    try:  # until the export itself is gone (reaped), not only strace
        for _ in range(200):
            os.killpg(p.pid, 0)
            time.sleep(0.05)
    except ProcessLookupError:
        pass
    got = which(OUT, refs)
    t.check(changed and got in ("A", "B"), "export killed at the first change of --out (renames held by strace): "
                                           "--out is entirely one model (%s)" % got)

    # A file system without renameat2(RENAME_EXCHANGE) (strace fails it with EINVAL): the switch is
    # two renames; killed between them, --out is missing and the next export puts the old model back.
    no_exchange = ["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=rename,renameat2", "-e",
                   "inject=renameat2:error=EINVAL"]
    export(1)
    p = subprocess.run(no_exchange + command(1, ["export", "--model", "tiny-llama", "--seed", "2", "--out", OUT,
                                                 "--force"] + SHARDS), env=traced, capture_output=True, text=True,
                       timeout=120)
    t.check(p.returncode == 0 and which(OUT, refs) == "B" and not leftovers(OUT),
            "without RENAME_EXCHANGE: the export switches by two renames, --out is model B, nothing left (%s%s)" %
            (leftovers(OUT), "" if p.returncode == 0 else "; exit %d: %s" % (p.returncode, p.stderr[-500:])))
    export(1)
    p = subprocess.Popen(no_exchange + ["-e", "inject=rename:delay_exit=300000"] +
                         command(1, ["export", "--model", "tiny-llama", "--seed", "2", "--out", OUT, "--force"] +
                                 SHARDS),
                         env=traced, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline and p.poll() is None and os.path.isdir(OUT):
        time.sleep(0.01)
    gone = not os.path.isdir(OUT)
    stop_group(p)
    try:
        for _ in range(200):
            os.killpg(p.pid, 0)
            time.sleep(0.05)
    except ProcessLookupError:
        pass
    aside = [n for n in leftovers(OUT) if n.endswith(".old")]
    p = subprocess.run(command(1, ["export", "--model", "tiny-llama", "--seed", "2", "--out", OUT] + SHARDS),
                       env=t.ENV, capture_output=True, text=True, timeout=120)
    t.check(gone and aside and p.returncode == 1 and "already holds a model" in p.stderr and
            which(OUT, refs) == "A" and not leftovers(OUT),
            "killed between the two renames (--out missing, the old model at %s): the next export puts model A back "
            "as --out and removes the rest (%s; left %s)" % (aside, fsdp_lines(p.stderr), leftovers(OUT)))
else:
    print("(strace not installed or not allowed to trace here: the kills between renames are not checked)")

# ---- 14. temporaries: SIGTERM/SIGINT clean up, the next export removes what SIGKILL left -------------
for sig in (signal.SIGTERM, signal.SIGINT):
    export(1)
    err_path = path("signal.err")
    with open(err_path, "w") as err_file:
        p = subprocess.Popen(command(1, ["export", "--model", "tiny-llama", "--seed", "2", "--out", OUT, "--force"] +
                                     SHARDS), env=dict(t.ENV, FSDP_TEST_FAIL="0:3:hang"), stdout=subprocess.DEVNULL,
                             stderr=err_file)
        deadline = time.time() + 60
        while time.time() < deadline and "injecting 'hang'" not in open(err_path).read():
            time.sleep(0.05)
        p.send_signal(sig)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    t.check(p.returncode != 0 and not leftovers(OUT) and which(OUT, refs) == "A",
            "%s while writing: exit %d, nothing left behind (%s), --out still model A" %
            (sig.name, p.returncode, leftovers(OUT)))

export(1)
p = export(2, env={"FSDP_TEST_FAIL": "0:%d:kill" % (PIECES // 2)})
left = leftovers(OUT)
p = subprocess.run(command(2, ["export", "--model", "tiny-llama", "--seed", "2", "--out", OUT, "--force"]),
                   env=t.ENV, capture_output=True, text=True, timeout=120)
t.check(left and p.returncode == 0 and not leftovers(OUT) and
        sorted(os.listdir(OUT)) == ["config.json", "generation_config.json", "model.safetensors"],
        "what a killed export left (%s) is gone after the next export into --out, which wrote one file: %s" %
        (left, sorted(os.listdir(OUT)) + leftovers(OUT)))

# ---- 2. two exports into one --out at once ----------------------------------------------------------
# A model large enough that an export takes a second or more, so the two overlap.
med = path("med.json")
json.dump({"model_type": "llama", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
           "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8,
           "max_position_embeddings": 256, "tie_word_embeddings": False}, open(med, "w"))
med_ref = {}
for seed in (1, 2):
    med_ref[seed] = path("med-%d" % seed)
    t.run(2, ["export", "--model", med, "--seed", str(seed), "--out", med_ref[seed]])
both = path("both")
procs, lines, ended = {}, {}, {}


def follow(seed, stream):
    """The export's lines on stderr, each with when it came."""
    for line in stream:
        lines[seed].append((time.time(), line.rstrip("\n")))


readers = []
for seed in (1, 2):
    cmd = command(2, ["export", "--model", med, "--seed", str(seed), "--out", both, "--force"])
    procs[seed] = subprocess.Popen(cmd, env=t.ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines[seed] = []
    readers.append(threading.Thread(target=follow, args=(seed, procs[seed].stderr)))
    readers[-1].start()
for seed, p in procs.items():
    p.wait(timeout=300)
    ended[seed] = time.time()
for r in readers:
    r.join()
done = {seed: p.returncode for seed, p in procs.items()}
winners = [s for s in done if done[s] == 0]
losers = [s for s in done if done[s] != 0]
if len(winners) == 1 and len(losers) == 1:
    w, l = winners[0], losers[0]
    errors = [(when, line) for when, line in lines[l] if line.startswith("fsdp:")]
    line = errors[0][1] if len(errors) == 1 else repr(errors)
    t.check(len(errors) == 1 and "being written by another fsdp export" in line and both in line and "pid" in line
            and errors[0][0] < ended[w],
            "the other export fails while the first still runs (%.1f s before it ends): %s" %
            (ended[w] - errors[0][0] if errors else 0, line))
    t.check(md5(os.path.join(both, "model.safetensors")) == md5(os.path.join(med_ref[w], "model.safetensors")) and
            md5(os.path.join(both, "config.json")) == md5(os.path.join(med_ref[w], "config.json")) and
            not leftovers(both), "the export that succeeded (seed %d) left exactly its own model" % w)
else:
    t.fail("two exports at once into one --out: exactly one must fail, got exit statuses %s" % done)

# ---- 13. prepare's memory bound holds for every document it accepts ---------------------------------
def peak_rss_mb(args):
    p = subprocess.run(["/usr/bin/time", "-f", "peak-kb %M", t.BIN, "prepare", "--quiet"] + args, env=t.ENV,
                       capture_output=True, text=True, timeout=600)
    return p.returncode, int(p.stderr.strip().splitlines()[-1].split()[-1]) / 1024.0, fsdp_lines(p.stderr)


small = path("small.txt")
with open(small, "w") as f:
    f.write("a few words\n")
BOUND = 24
_, base, _ = peak_rss_mb(["--tokenizer", LLAMA2, "--input", small, "--out", path("small.bin"), "--max-memory",
                          str(BOUND)])
accepted = 0
# Runs of "  x": Llama 2's BPE takes a whole document as one word, its costliest per byte.
for size in (300_000, 1_900_000):
    doc = path("doc-%d.txt" % size)
    with open(doc, "w") as f:
        f.write(("  x" * (size // 3 + 1))[:size])
    rc, peak, lines = peak_rss_mb(["--tokenizer", LLAMA2, "--input", doc, "--out", path("doc.bin"), "--max-memory",
                                   str(BOUND), "--threads", "2"])
    if rc == 0:
        accepted += 1
        if ASAN:
            print("(peak RSS of a %d-byte document not checked under AddressSanitizer)" % size)
        else:
            t.check(peak - base <= BOUND, "one document of %d bytes, --max-memory %d: peak RSS grows by %.0f MB" %
                    (size, BOUND, peak - base))
    else:
        t.check(rc == 1 and len(lines) == 1 and "--max-memory" in lines[0],
                "one document of %d bytes above what --max-memory %d allows is refused: %s" % (size, BOUND, lines))
t.check(accepted >= 1, "a document within the bound is accepted")

# ---- 15. messages -----------------------------------------------------------------------------------
refused("--val-fraction that leaves the training file empty", 1,
        ["prepare", "--quiet", "--tokenizer", tok, "--input", text, "--split-on", "blank-lines", "--out",
         path("v.bin"), "--val-fraction", "0.999999"], ["--val-fraction", "empty"], [text],
        absent=[path("v.bin"), path("v.val.bin"), path("v.bin.tmp"), path("v.val.bin.tmp")])
p = subprocess.run(command(1, ["eval", "--init-from", hf, "--data", data, "--seq", "1000"]), env=t.ENV,
                   capture_output=True, text=True, timeout=120)
lines = fsdp_lines(p.stderr)
helptext = subprocess.run([t.BIN, "eval", "--help"], env=t.ENV, capture_output=True, text=True, timeout=60).stdout
named = [w.strip(".,;:()") for w in (lines[0] if lines else "").split() if w.startswith("--")]
t.check(p.returncode == 2 and len(lines) == 1 and all(n.split("=")[0] in helptext for n in named),
        "eval --seq 1000 beyond max_position_embeddings: one line naming only flags eval takes: %s" % lines)
rc, _, _ = t.run(1, ["eval", "--init-from", hf, "--data", data, "--seq", "300", "--allow-longer-seq"], check=False)
t.check(rc == 0, "eval --seq 300 --allow-longer-seq evaluates beyond max_position_embeddings")

t.finish()
