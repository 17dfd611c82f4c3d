"""Inputs that cannot hang a command or make a run train on nothing (issue 21, items 7, 8, 10, 11, 12
and two messages of 15); each check fails on the code before these fixes:
  10. a FIFO where a command reads a file, in the 8 places that used to block in open(): train
      --eval-data; train and eval --init-from DIR whose tokenizer.json is a FIFO; export --checkpoint DIR
      whose config.json is one; generate --init-from DIR whose generation_config.json is one; generate,
      tokenize and prepare --tokenizer FIFO. Each ends within seconds, non-zero, with one line naming it
      (each run killed after 5 s, so a regression fails instead of hanging).
  11. a rank that never joins MPI's start-up (a wrapper that starts only a sleep in its place): the
      rank that waits ends after FSDP_SYNC_TIMEOUT with one line naming its rank, host and what it
      waited for; a rank stalled by FSDP_TEST_FAIL=1:0:hang (before MPI_Init_thread) the same, one
      line per rank.
  12. config.json with 3,000,000 and 10,000,000 layers (hidden 48): train and plan refuse it naming
      the file and num_hidden_layers, with a peak RSS far below the gigabytes the layout used to take
      (counted above the RSS of `fsdp --version`: a build with CUDA maps ~230 MB of cuBLAS at load).
  8.  a NaN or an infinity in a model.safetensors that train or eval --init-from imports: refused
      naming the file, the tensor and the first bad element (it used to train with every step skipped
      and exit 0). An export converts such values as they are (safetensors_numpy.py).
  7.  an Alpaca file whose prompts are longer than --seq (no target counts): refused at the start of
      training, as --data and as --eval-data (it used to train at loss 0.0000 and exit 0).
  15. pad_token_id -1 and hidden_size 4.8e1 get messages that say what is wrong."""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing
import safetensors_np as st

D = t.tmpdir("safe-inputs")
ASAN = "ASAN_OPTIONS" in os.environ


def path(*names):
    return os.path.join(D, *names)


def descendants(pid):
    """Every process below pid (mpirun's ranks, a wrapper's sleep)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def launch(cmd, limit, env=None, preexec=None):
    """(exit status or None when it ran past `limit` s and was killed with everything it started,
    seconds, stdout, stderr)."""
    start = time.time()
    p = subprocess.Popen(cmd, env=dict(t.ENV, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, start_new_session=True, preexec_fn=preexec)
    try:
        out, err = p.communicate(timeout=limit)
        return p.returncode, time.time() - start, out, err
    except subprocess.TimeoutExpired:
        for pid in descendants(p.pid) + [p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = p.communicate()
        return None, time.time() - start, out, err


def ours(text):
    """The program's own lines, without the test hook's announcements."""
    return [l for l in text.splitlines() if l.startswith("fsdp:") and "FSDP_TEST_FAIL: injecting" not in l]


def refused(what, cmd, needles, limit=5.0, env=None, preexec=None, absent=()):
    """Exit non-zero within `limit` s (killed then) with one error line holding every needle."""
    rc, took, out, err = launch(cmd, limit, env, preexec)
    lines = [l for l in ours(err) if l.startswith("fsdp: error:")]
    ok = rc not in (None, 0) and took < limit and len(lines) == 1 and all(n in lines[0] for n in needles)
    ok = ok and not any(a in lines[0] for a in absent) and "step 1/" not in out
    t.check(ok, "%s: refused in %.1f s, exit %s, one line: %s" % (what, took, "killed (a hang)" if rc is None else rc,
                                                                 lines[0] if len(lines) == 1 else (lines or err[-400:])))
    return lines[0] if lines else ""


def fsdp(*args, nprocs=1):
    return ([t.MPIRUN, "-np", str(nprocs)] if nprocs > 1 else []) + [t.BIN] + list(args)


# ---- fixtures: a tiny Llama as a Hugging Face directory, a token file, FIFOs -------------------------
GOOD = path("good")
t.run(1, ["export", "--model", "tiny-llama", "--out", GOOD, "--dtype", "fp32"])
CONFIG = json.load(open(os.path.join(GOOD, "config.json")))
TENSORS = st.read(os.path.join(GOOD, "model.safetensors"))[0]

FIFO = path("fifo")
os.mkfifo(FIFO)


def model_dir(name, fifo_file=None):
    d = path(name)
    shutil.copytree(GOOD, d)
    if fifo_file:
        f = os.path.join(d, fifo_file)
        if os.path.exists(f):
            os.remove(f)
        os.mkfifo(f)
    return d


rng = np.random.default_rng(7)
docs = [[int(x) for x in rng.integers(3, 200, 40)] for _ in range(10)]
TOKENS = path("tokens.bin")  # records a tokenizer hash, so a model directory's tokenizer.json is read
packing.write_v2(TOKENS, docs, 256, tok_hash=0x1234)

# ---- 10: FIFOs ----------------------------------------------------------------------------------------
TRAIN = ["--seq", "16", "--mbs", "2", "--steps", "1", "--device", "cpu"]
tok_fifo = model_dir("tokenizer-fifo", "tokenizer.json")
cfg_fifo = model_dir("config-fifo", "config.json")
gen_fifo = model_dir("generation-fifo", "generation_config.json")
for what, args, named in (
        ("train --eval-data FIFO", ["train", "--model", "tiny-llama", "--eval-data", FIFO] + TRAIN, FIFO),
        ("train --init-from DIR with a FIFO tokenizer.json",
         ["train", "--init-from", tok_fifo, "--data", TOKENS, "--packing", "pad"] + TRAIN,
         os.path.join(tok_fifo, "tokenizer.json")),
        ("eval --init-from DIR with a FIFO tokenizer.json",
         ["eval", "--init-from", tok_fifo, "--data", TOKENS, "--packing", "pad", "--seq", "16", "--device", "cpu"],
         os.path.join(tok_fifo, "tokenizer.json")),
        ("export --checkpoint DIR with a FIFO config.json", ["export", "--checkpoint", cfg_fifo, "--out", path("x")],
         os.path.join(cfg_fifo, "config.json")),
        ("generate --init-from DIR with a FIFO generation_config.json",
         ["generate", "--init-from", gen_fifo, "--prompt-ids", "1 2", "--print-ids", "--device", "cpu"],
         os.path.join(gen_fifo, "generation_config.json")),
        ("generate --tokenizer FIFO", ["generate", "--init-from", GOOD, "--tokenizer", FIFO, "--prompt", "hi",
                                       "--device", "cpu"], FIFO),
        ("tokenize --tokenizer FIFO", ["tokenize", "--tokenizer", FIFO], FIFO),
        ("prepare --tokenizer FIFO", ["prepare", "--tokenizer", FIFO, "--input", os.path.join(GOOD, "config.json"),
                                      "--out", path("prepared.bin")], FIFO)):
    refused("a FIFO: " + what, fsdp(*args), [named, "is a FIFO"])

# ---- 11: a rank that never joins MPI's start-up ---------------------------------------------------------
SYNC = 3
HOST = os.uname().nodename
# Rank 1 of the job is a sleep instead of fsdp: rank 0 waits inside MPI_Init_thread.
wrapper = ['sh', '-c', 'if [ "${OMPI_COMM_WORLD_RANK:-$PMIX_RANK}" = 1 ]; then exec sleep 40; fi; exec "$0" "$@"']
rc, took, out, err = launch([t.MPIRUN, "-np", "2"] + wrapper + [t.BIN, "train", "--model", "tiny-llama"] + TRAIN,
                            SYNC + 20, {"FSDP_SYNC_TIMEOUT": str(SYNC)})
lines = ours(err + out)
t.check(rc not in (None, 0) and took < SYNC + 10 and len(lines) == 1 and
        all(n in lines[0] for n in ("rank 0 on %s" % HOST, "MPI start-up", "FSDP_SYNC_TIMEOUT")),
        "a rank that never joins MPI's start-up: the waiting rank ends in %.1f s (FSDP_SYNC_TIMEOUT=%d), exit %s, one "
        "line: %s" % (took, SYNC, "killed (a hang)" if rc is None else rc, lines if lines else err[-400:]))
# A rank stalled before MPI_Init_thread by the test hook (fsdp export, which the issue saw hang too).
rc, took, out, err = launch(fsdp("export", "--model", "tiny-llama", "--out", path("never"), nprocs=2), SYNC + 20,
                            {"FSDP_SYNC_TIMEOUT": str(SYNC), "FSDP_TEST_FAIL": "1:0:hang"})
lines = ours(err + out)
per_rank = [[l for l in lines if l.startswith("fsdp: rank %d on %s:" % (r, HOST))] for r in (0, 1)]
t.check(rc not in (None, 0) and took < SYNC + 10 and len(lines) == 2 and all(len(p) == 1 for p in per_rank) and
        all("MPI start-up" in l for l in lines) and not os.path.exists(path("never")),
        "a rank stalled during start-up (FSDP_TEST_FAIL=1:0:hang): ended in %.1f s, exit %s, one line per rank: %s" %
        (took, "killed (a hang)" if rc is None else rc, lines if lines else err[-400:]))

# ---- 12: layer counts that would exhaust memory before the memory check ----------------------------------
PEAK_MB = 200  # above the binary's own footprint at start-up


def small_address_space():
    """Without the fix the layout of millions of layers takes gigabytes: stop it at 3 GB instead (not
    under AddressSanitizer, whose shadow memory needs terabytes of address space)."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def peak_rss_mb(cmd):
    """Runs cmd as the only child of a Python process; its peak RSS in MB and its stderr."""
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "sys.stderr.write(p.stderr)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(p.returncode)\n")
    rc, took, out, err = launch([sys.executable, "-c", probe] + cmd, 60, preexec=None if ASAN else small_address_space)
    try:
        return rc, took, int(out.strip().splitlines()[-1]) / 1024.0, err
    except (ValueError, IndexError):
        return rc, took, float("inf"), err


rc, _, loaded, err = peak_rss_mb(fsdp("--version"))
t.check(rc == 0 and loaded < float("inf"), "fsdp --version runs at a peak RSS of %.0f MB (the baseline): %s" %
        (loaded, err[-300:]))
for layers in (3000000, 10000000):
    big = path("layers-%d.json" % layers)
    json.dump(dict(CONFIG, num_hidden_layers=layers), open(big, "w"))
    for command in (["train", "--model", big] + TRAIN, ["plan", "--model", big, "--device", "cpu"]):
        rc, took, peak, err = peak_rss_mb(fsdp(*command))
        lines = [l for l in ours(err) if l.startswith("fsdp: error:")]
        t.check(rc not in (None, 0) and len(lines) == 1 and big in lines[0] and
                "num_hidden_layers %d" % layers in lines[0] and peak - loaded < PEAK_MB,
                "fsdp %s with num_hidden_layers %d: refused in %.1f s at a peak RSS of %.0f MB (%.0f above --version's, "
                "< %d), naming the file and the field: %s" % (command[0], layers, took, peak, max(0.0, peak - loaded), PEAK_MB,
                                                               lines or err[-300:]))

# ---- 8: non-finite imported weights --------------------------------------------------------------------
UP = "model.layers.1.mlp.up_proj.weight"
for name, value in (("nan", np.nan), ("inf", -np.inf)):
    d = path("weights-" + name)
    os.makedirs(d)
    shutil.copy(os.path.join(GOOD, "config.json"), d)
    tensors = {k: (v[0], list(v[1]), v[2].copy()) for k, v in TENSORS.items()}
    tensors[UP][2].reshape(-1)[1234] = value
    st.write(os.path.join(d, "model.safetensors"), tensors, metadata={"format": "pt"})
    refused("train --init-from a model whose %s holds %s" % (UP, name),
            fsdp("train", "--init-from", d, "--seq", "16", "--mbs", "2", "--steps", "3", "--device", "cpu", nprocs=2),
            [os.path.join(d, "model.safetensors"), UP, "non-finite", "element 1234"], limit=30)
refused("eval --init-from a model that holds -inf",
        fsdp("eval", "--init-from", d, "--data", TOKENS, "--packing", "pad", "--seq", "16", "--device", "cpu"),
        [os.path.join(d, "model.safetensors"), UP, "element 1234"], limit=30)

# ---- 7: a file where no token counts in the loss ----------------------------------------------------------
# Alpaca examples of 40 tokens whose responses are the last 6: at --seq 16 an example keeps its first 17.
alpaca = path("alpaca-long-prompts.bin")
packing.write_v2(alpaca, docs, 256, masks=[[0] * 34 + [1] * 6 for _ in docs])
refused("training on Alpaca prompts longer than --seq",
        fsdp("train", "--model", "tiny-llama", "--data", alpaca, "--seq", "16", "--mbs", "2", "--steps", "3",
             "--device", "cpu", nprocs=2), ["--data", alpaca, "no token of it counts in the loss"], limit=30)
refused("the same file as --eval-data",
        fsdp("train", "--model", "tiny-llama", "--eval-data", alpaca, "--seq", "16", "--mbs", "2", "--steps", "3",
             "--device", "cpu", nprocs=2), ["--eval-data", alpaca, "no token of it counts in the loss"], limit=30)
rc, out, err = t.run(1, ["train", "--model", "tiny-llama", "--data", alpaca, "--seq", "64", "--mbs", "2", "--steps", "1",
                         "--device", "cpu"], check=False)
t.check(rc == 0 and "step 1/1" in out and "loss 0.0000" not in out,
        "at --seq 64 the responses count and the same file trains")

# ---- 15: two messages of config.json ----------------------------------------------------------------------
for what, change, needles, wrong in (
        ("pad_token_id -1", {"pad_token_id": -1}, ["pad_token_id -1 is not a token id", "non-negative"],
         "not an integer"),
        ("hidden_size 4.8e1", {"hidden_size": 48.0}, ["hidden_size 48.0 is a real number, not an integer", "write 48"],
         "48 is not")):
    c = path("config-%s.json" % what.split()[0])
    # As the file would spell it: json.dumps writes 48.0 for 4.8e1, which Jansson reads the same.
    open(c, "w").write(json.dumps(dict(CONFIG, **change)).replace('"hidden_size": 48.0', '"hidden_size": 4.8e1'))
    refused("config.json with " + what, fsdp("plan", "--model", c, "--device", "cpu"), [c] + needles, absent=[wrong])
t.finish()
