"""The commands that never talk to another rank run without MPI when nothing launched several ranks:
with an Open MPI that cannot start (OMPI_MCA_pml names no component: MPI_Init fails, as a singleton
on a login node whose PMI is unreachable does), `fsdp --version`, `--help`, `tokenize`, `prepare` and
`report` still work, while `train` (which needs MPI) fails - so the check can fail. Under mpirun with
two ranks the same commands still start MPI and answer once."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from tokfixtures import gpt2_tokenizer

D = t.tmpdir("without-mpi")
BROKEN = dict(t.ENV, OMPI_MCA_pml="no-such-component")


def fsdp(args, env=BROKEN, stdin=None, launcher=()):
    p = subprocess.run(list(launcher) + [t.BIN] + args, env=env, input=stdin, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


tok = gpt2_tokenizer(os.path.join(D, "tokenizer.json"))
rc, out, err = fsdp(["train", "--model", "tiny-llama", "--steps", "1", "--device", "cpu"], env=dict(t.ENV, **{
    "OMPI_MCA_pml": "no-such-component"}))
t.check(rc != 0, "train with an MPI that cannot start fails (the environment does break MPI): exit %d" % rc)

rc, out, err = fsdp(["--version"])
t.check(rc == 0 and out.startswith("fsdp.c "), "--version without MPI: exit %d %r %s" % (rc, out, err[-300:]))
rc, out, err = fsdp(["--help"])
t.check(rc == 0 and "commands:" in out, "--help without MPI: exit %d %s" % (rc, err[-300:]))
rc, out, err = fsdp(["tokenize", "--tokenizer", tok, "--no-special"], stdin="Hello world\n")
t.check(rc == 0 and out.split() == ["15496", "995"], "tokenize without MPI: exit %d %r %s" % (rc, out, err[-300:]))

docs = os.path.join(D, "docs.jsonl")
with open(docs, "w") as f:
    for x in ("Hello world", "a second document"):
        f.write(json.dumps({"text": x}) + "\n")
rc, out, err = fsdp(["prepare", "--tokenizer", tok, "--input", docs, "--format", "jsonl", "--out",
                     os.path.join(D, "docs.bin"), "--quiet"])
t.check(rc == 0 and os.path.getsize(os.path.join(D, "docs.bin")) > 0, "prepare without MPI: exit %d %s" %
        (rc, err[-300:]))

metrics = os.path.join(D, "runs")
os.makedirs(metrics)
t.run(1, ["train", "--model", "tiny-llama", "--steps", "2", "--seq", "16", "--mbs", "2",
          "--metrics", os.path.join(metrics, "run.jsonl")])
rc, out, err = fsdp(["report", metrics, "--out", os.path.join(D, "report")])
t.check(rc == 0 and os.path.exists(os.path.join(D, "report", "report.md")), "report without MPI: exit %d %s %s" %
        (rc, out[-300:], err[-300:]))

# Launched as two ranks, MPI starts as before: one answer, from rank 0.
rc, out, err = fsdp(["--version"], env=t.ENV, launcher=(t.MPIRUN, "-np", "2"))
t.check(rc == 0 and out.count("fsdp.c ") == 1, "mpirun -np 2 fsdp --version: one line: exit %d %r %s" %
        (rc, out, err[-300:]))
t.finish()
