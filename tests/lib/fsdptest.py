"""Shared helpers for the end-to-end tests: run the fsdp program under mpirun, read its metrics and
checkpoints, compare runs. Used by tests/scripts/*.py (run with /usr/bin/python3)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.environ.get("FSDP_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("FSDP_BIN") or os.path.join(ROOT, "build", "fsdp")
TOOLS = os.environ.get("FSDP_TOOLS_DIR") or os.path.join(ROOT, "build", "tests")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
# Set by a sanitizer build's tests (tests/CMakeLists.txt): a script may then run fewer of the layouts
# that repeat one code path, never fewer kinds of check.
SANITIZED = os.environ.get("FSDP_TEST_SANITIZED") == "1"

ENV = dict(os.environ)
ENV.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1", "HDF5_USE_FILE_LOCKING": "FALSE"})

FAILURES = []


def has_cuda_backend():
    """The number of visible GPUs when the built program has the CUDA backend, else 0."""
    try:
        version = subprocess.run([BIN, "--version"], env=ENV, capture_output=True, text=True, timeout=60).stdout
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    present = sum(1 for l in gpus.splitlines() if l.startswith("GPU"))
    # nvidia-smi lists every GPU of the host; the program sees only CUDA_VISIBLE_DEVICES' ones.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = 0
        for d in visible.split(","):  # CUDA stops at the first entry that names no GPU
            if not d.strip() or d.strip().startswith("-"):
                break
            listed += 1
        present = min(present, listed)
    return "cuda" in version and present


def hf_torch(name):
    """For the scripts that compare with transformers on the GPU: re-runs the script under
    FSDP_HF_PYTHON when that is set; exits 77 (skipped) without a GPU and the CUDA backend, or
    without torch and transformers; else returns (torch, transformers) with TF32 off, so that fp32
    on the GPU is fp32."""
    other = os.environ.get("FSDP_HF_PYTHON")
    if other and os.path.realpath(other) != os.path.realpath(sys.executable):
        os.execv(other, [other] + sys.argv)
    if has_cuda_backend() < 1:
        print("%s: SKIPPED (needs a GPU and fsdp.c's CUDA backend)" % name)
        sys.exit(77)
    try:
        import torch
        import transformers
    except ImportError as e:
        print("%s: SKIPPED (%s: %s lacks torch/transformers; set FSDP_HF_PYTHON)" % (name, e, sys.executable))
        sys.exit(77)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch, transformers


def tmpdir(name):
    base = os.environ.get("FSDP_TEST_TMP") or tempfile.gettempdir()
    path = os.path.join(base, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def run(nprocs, args, timeout=300, check=True, device="cpu"):
    """Runs `fsdp ARGS` on nprocs ranks (one rank: directly, as an MPI singleton, the way a user
    runs it without a launcher); returns (returncode, stdout, stderr)."""
    cmd = ([MPIRUN, "-np", str(nprocs)] if nprocs > 1 else []) + [BIN] + list(args)
    if device and args and args[0] == "train" and "--device" not in args:
        cmd += ["--device", device]
    try:
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail("timed out after %ds: %s" % (timeout, " ".join(cmd)))
        return 124, "", "timeout"
    if check and p.returncode != 0:
        fail("exit %d: %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:], p.stderr[-3000:]))
    return p.returncode, p.stdout, p.stderr


def metrics(path):
    """(per-step records, summary record) of a --metrics file."""
    steps, summary = [], None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("summary"):
                summary = rec
            else:
                steps.append(rec)
    return steps, summary


def checkpoint_arrays(path):
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def rel(a, b):
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def fail(msg):
    FAILURES.append(msg)
    print("FAIL: " + msg, flush=True)


def check(cond, msg):
    if cond:
        print("ok: " + msg, flush=True)
    else:
        fail(msg)


def finish():
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        sys.exit(1)
    print("all checks passed")
    sys.exit(0)


def compare_losses(a, b, tol, what):
    """Relative difference of two runs' per-step losses, at most tol."""
    la = [r["loss"] for r in a]
    lb = [r["loss"] for r in b]
    if len(la) != len(lb):
        fail("%s: %d vs %d steps" % (what, len(la), len(lb)))
        return
    worst = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(la, lb)) if la else 0.0
    check(worst <= tol, "%s: losses agree over %d steps (worst relative difference %.2e <= %.0e)" % (what, len(la), worst, tol))


def compare_checkpoints(pa, pb, tol, what, exact=False, skip=None):
    """All tensors (weights and Adam moments) of two checkpoints agree; names containing `skip` are
    left out of the comparison."""
    import numpy as np
    a, b = checkpoint_arrays(pa), checkpoint_arrays(pb)
    if skip:
        a = {k: v for k, v in a.items() if skip not in k}
        b = {k: v for k, v in b.items() if skip not in k}
    if set(a) != set(b):
        fail("%s: checkpoints hold different tensors: %s" % (what, sorted(set(a) ^ set(b))[:5]))
        return
    if exact:
        same = all(np.array_equal(a[k], b[k]) for k in a)
        check(same, "%s: %d tensors bitwise identical" % (what, len(a)))
        return
    worst = max(rel(a[k], b[k]) for k in a)
    check(worst <= tol, "%s: %d tensors agree (worst relative difference %.2e <= %.0e)" % (what, len(a), worst, tol))
