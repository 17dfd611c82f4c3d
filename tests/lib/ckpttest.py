"""Shared by the checkpoint tests (tests/scripts/ckpt_*.py, preemption.py): a tiny run's flags,
jobs started in the background and signalled, the checksum of docs/FORMATS.md recomputed with numpy,
and file surgery (flipped bytes, edited attributes)."""
import os
import re
import signal
import subprocess
import threading
import time

import fsdptest as t

# Deterministic and quick: fp32 everywhere, so resuming on the same layout is bit for bit.
TINY = ["--model", "tiny-llama", "--seq", "16", "--mbs", "2", "--lr", "2e-3", "--warmup", "2",
        "--model-precision", "fp32", "--mixed-precision", "no", "--device", "cpu"]


def train(d, steps, extra=(), metrics="m.jsonl"):
    # A resume may go on past the checkpoint's --steps (the tests check files and losses, not the
    # schedule): the flag that accepts a re-spanned cosine.
    allow = ["--allow-schedule-change"] if "--resume" in extra else []
    return ["train"] + TINY + ["--steps", str(steps), "--ckpt-dir", os.path.join(d, "ck"),
                               "--metrics", os.path.join(d, metrics)] + list(extra) + allow


class Job:
    """`fsdp ARGS` under mpirun in its own session; output collected by a thread."""

    def __init__(self, nprocs, args, env=None):
        cmd = ([t.MPIRUN, "-np", str(nprocs)] if nprocs > 1 else []) + [t.BIN] + list(args)
        self.p = subprocess.Popen(cmd, env=dict(t.ENV, **(env or {})), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines, self.marks = [], {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)
            if "FSDP_TEST_FAIL: injecting" in line and "injected" not in self.marks:
                self.marks["injected"] = time.time()

    def output(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=120):
        """True once a line matches the regex; False when the job ends or the time runs out first."""
        end = time.time() + timeout
        while time.time() < end:
            if any(re.search(pattern, l) for l in list(self.lines)):
                return True
            if self.p.poll() is not None:
                self.reader.join(5)
                return any(re.search(pattern, l) for l in self.lines)
            time.sleep(0.05)
        return False

    def wait(self, timeout=180):
        """The exit status, or None after killing the whole job when it did not end in time."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        self.reader.join(10)
        return rc

    def kill(self):
        """SIGKILL to every rank, then to mpirun (Open MPI puts the ranks in process groups of their
        own, so killing mpirun's group alone would leave them running)."""
        for pid in self.rank_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()

    def rank_pids(self):
        """The pids of the fsdp processes of this job (mpirun's children), by rank order of start."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmd = f.read().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.p.pid and cmd and cmd[0].endswith(b"fsdp"):
                pids.append(int(entry))
        return sorted(pids)


def fsdp_lines(text):
    """The program's own lines (errors, notices), without the test hook's announcements."""
    return [l for l in text.splitlines() if l.startswith("fsdp:") and "FSDP_TEST_FAIL" not in l]


def one_error(text, needles, what):
    """Exactly one 'fsdp: error:' line, holding every needle, and no crash."""
    errors = [l for l in fsdp_lines(text) if l.startswith("fsdp: error:")]
    crashed = any(w in text for w in ("Segmentation", "core dumped", "Aborted (", "double free"))
    ok = len(errors) == 1 and all(n in errors[0] for n in needles) and not crashed
    t.check(ok, "%s: one error line with %s (%s)" % (what, needles, errors[0] if len(errors) == 1 else errors[:3] or text[-500:]))


# ---- the checksum of docs/FORMATS.md, independently --------------------------------------------------

GOLDEN = 0x9E3779B97F4A7C15
M1, M2 = 0xff51afd7ed558ccd, 0xc4ceb9fe1a85ec53
MASK = (1 << 64) - 1


def _fmix64_np(k):
    import numpy as np
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(M1)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(M2)
    return k ^ (k >> np.uint64(33))


def tensor_checksum(array):
    """Sum mod 2^64 over elements i of fmix64(i * GOLDEN + bits(x_i))."""
    import numpy as np
    with np.errstate(over="ignore"):
        bits = np.ascontiguousarray(array, dtype="<f4").ravel().view(np.uint32).astype(np.uint64)
        i = np.arange(bits.size, dtype=np.uint64)
        return int(_fmix64_np(i * np.uint64(GOLDEN) + bits).sum(dtype=np.uint64))


def _fmix64(k):
    k ^= k >> 33
    k = (k * M1) & MASK
    k ^= k >> 33
    k = (k * M2) & MASK
    return k ^ (k >> 33)


def bytes_checksum(seed, data):
    h = _fmix64(seed ^ ((len(data) * GOLDEN) & MASK))
    for i in range(0, len(data), 8):
        w = int.from_bytes(data[i:i + 8], "little")
        h = _fmix64(h ^ _fmix64((w + i * GOLDEN) & MASK))
    return h


def attributes_checksum(attrs):
    head = ("format_version=%d\nstep=%d\nsamples_seen=%d\nseed=%d\nworld_size=%d\nstrategy=%s\n" % (
        int(attrs["format_version"]), int(attrs["step"]), int(attrs["samples_seen"]), int(attrs["seed"]),
        int(attrs["world_size"]), attrs["strategy"])).encode()
    h = bytes_checksum(0, head)
    for name in ("config", "schedule", "run"):
        text = attrs[name].encode()
        h = bytes_checksum(h, ("%s=%d:" % (name, len(text))).encode())
        h = bytes_checksum(h, text)
    return h


# ---- surgery --------------------------------------------------------------------------------------

def flip_byte(path, dataset, element=0):
    """Flips one bit of one element of a dataset, in place, where its bytes are."""
    import h5py
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset + 4 * element + 2)
        b = f.read(1)
        f.seek(offset + 4 * element + 2)
        f.write(bytes([b[0] ^ 0x04]))


def set_attr(path, name, value):
    import h5py
    with h5py.File(path, "r+") as f:
        f.attrs[name] = value


def step_files(ck):
    return sorted(n for n in os.listdir(ck) if re.fullmatch(r"step-\d+\.h5", n)) if os.path.isdir(ck) else []


def latest(ck):
    p = os.path.join(ck, "latest")
    return open(p).read().strip() if os.path.exists(p) else None


def temporaries(ck):
    return sorted(n for n in os.listdir(ck) if n.endswith(".tmp")) if os.path.isdir(ck) else []
