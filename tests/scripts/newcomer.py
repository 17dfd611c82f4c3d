"""The rough edges a new user hit (issue 24), each checked the way they met it:

- `fsdp --help` and `fsdp train --help` name every family of the registry (Qwen2 was missing);
- Hugging Face's flag names (--learning_rate, --max_steps, --bf16, ...) are answered with fsdp.c's;
- --metrics into a folder that does not exist yet is made (a file in the way: one line, exit 2);
- --mixed-precision defaults to no (fp32) on the CPU backend and bf16 on GPUs (plan shows both);
- resuming with a larger --steps is refused in one line naming both totals and the flag to accept,
  and --allow-schedule-change continues on the new cosine (the rates checked here);
- a fine-tune started with --init-from alone names its model in the summary, so `fsdp report`
  lists it; `fsdp eval --metrics` files are listed as evaluations, not as failed runs or curves;
- `fsdp eval --checkpoint` says when the data's ids are not those the checkpoint was trained on;
- `prepare --format jsonl` without the field lists the fields the record has;
- outside SLURM the job scripts start one rank per GPU that CUDA_VISIBLE_DEVICES leaves, and name
  CPU runs' folders cpu, not gpu;
- tools/fixtures.sh with every fixture present fetches nothing and installs nothing (a GPU compute
  node has no network and no apt)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t  # noqa: E402
import packing  # noqa: E402

W = t.tmpdir("newcomer")


def path(*names):
    return os.path.join(W, *names)


def fsdp(args, n=1, **kw):
    return t.run(n, args, check=False, **kw)


def error_lines(err):
    return [l for l in err.splitlines() if l.startswith("fsdp: error:")]


# ---- --help names the registry's families ------------------------------------------------------------
registry = open(os.path.join(t.ROOT, "src", "model", "family.c")).read()
registered = re.findall(r"&fsdp_family_(\w+)", registry)
names = []
for fam in registered:
    src = open(os.path.join(t.ROOT, "src", "model", "families", fam + ".c")).read()
    names.append(re.search(r'\.architecture = "(\w+)ForCausalLM"', src).group(1))
t.check(len(names) >= 3 and "Qwen2" in names, "the registry has its families (%s)" % ", ".join(names))
top = subprocess.run([t.BIN, "--help"], capture_output=True, text=True, env=t.ENV).stdout
train_help = subprocess.run([t.BIN, "train", "--help"], capture_output=True, text=True, env=t.ENV).stdout
for name in names:
    t.check(name in top and name in train_help, "fsdp --help and fsdp train --help name %s" % name)

# ---- Hugging Face's flag names ---------------------------------------------------------------------------
for theirs, ours in (("--learning_rate=3e-4", "--lr"), ("--max_steps=10", "--steps"),
                     ("--per_device_train_batch_size=4", "--mbs"), ("--bf16", "--mixed-precision bf16"),
                     ("--gradient_accumulation_steps=2", "--grad-accum"), ("--num_train_epochs=1", "--epochs"),
                     ("--output_dir=out", "--ckpt-dir"), ("--warmup_steps=5", "--warmup")):
    rc, out, err = fsdp(["train", theirs])
    lines = error_lines(err)
    flag = theirs.split("=")[0]
    t.check(rc == 2 and len(lines) == 1 and "%s is Hugging Face's name; fsdp.c calls it %s" % (flag, ours) in lines[0],
            "%s: one line pointing to %s: %s" % (flag, ours, lines[0] if lines else err[-200:]))
rc, out, err = fsdp(["train", "--weight_decay", "0.1"])
t.check(rc == 2 and "fsdp.c spells it --weight-decay" in err, "--weight_decay: our spelling is named: %s" % err.strip())
rc, out, err = fsdp(["train", "--no-such-flag"])
t.check(rc == 2 and "unknown flag '--no-such-flag' (see fsdp train --help)" in err, "an unknown flag stays unknown")

# ---- --metrics into a missing folder; the CPU's default precision ------------------------------------------
TINY = ["train", "--model", "tiny-llama", "--seq", "16", "--mbs", "2", "--lr", "1e-2", "--warmup", "1", "--seed", "3"]
metrics = path("new", "deeper", "m.jsonl")
rc, out, err = fsdp(TINY + ["--steps", "2", "--metrics", metrics])
t.check(rc == 0 and os.path.isfile(metrics), "--metrics new/deeper/m.jsonl: the folders are made (%d) %s" %
        (rc, err[-300:]))
steps, summary = t.metrics(metrics) if rc == 0 else ([], None)
t.check(summary is not None and summary["mixed_precision"] == "no" and summary["model_precision"] == "fp32",
        "on the CPU backend --mixed-precision defaults to no (fp32 compute): %s" %
        (summary and summary["mixed_precision"]))
t.check("fp32 compute" in out, "the run's description says fp32 compute")
open(path("afile"), "w").write("not a folder\n")
rc, out, err = fsdp(TINY + ["--steps", "1", "--metrics", path("afile", "m.jsonl")])
lines = error_lines(err)
t.check(rc == 2 and len(lines) == 1 and path("afile") in lines[0] and "not a directory" in lines[0],
        "--metrics under a regular file: one line naming it: %s" % (lines[0] if lines else err[-300:]))
for device, want in (("cpu", "fp32"), ("cuda", "bf16")):
    rc, out, err = fsdp(["plan", "--model", "tiny-llama", "--device", device, "--gpu-mem", "80", "--json"])
    plan = json.loads(out) if rc == 0 else {}
    t.check(plan.get("compute_dtype") == want, "fsdp plan --device %s computes in %s by default (%s)" %
            (device, want, plan.get("compute_dtype")))

# ---- resuming with a larger --steps ----------------------------------------------------------------------
ck = path("ck")
rc, out, err = fsdp(TINY + ["--steps", "4", "--ckpt-dir", ck, "--metrics", path("first.jsonl")], n=2)
t.check(rc == 0, "4 steps with a checkpoint (%d) %s" % (rc, err[-300:]))
rc, out, err = fsdp(TINY + ["--steps", "8", "--ckpt-dir", ck, "--resume", "auto"], n=2)
lines = error_lines(err)
t.check(rc == 2 and len(lines) == 1 and all(w in lines[0] for w in ("--steps 8", " 4 steps", "--allow-schedule-change")),
        "--steps 8 on a checkpoint of a 4-step schedule: one line naming both and the flag: %s" %
        (lines[0] if lines else err[-300:]))
resumed = path("resumed.jsonl")
rc, out, err = fsdp(TINY + ["--steps", "8", "--ckpt-dir", ck, "--resume", "auto", "--allow-schedule-change",
                            "--metrics", resumed], n=2)
t.check(rc == 0 and "--allow-schedule-change" in out + err, "--allow-schedule-change: resumed, and said so (%d) %s" %
        (rc, err[-300:]))
if rc == 0:
    rates = {r["step"]: r["lr"] for r in t.metrics(resumed)[0] if "lr" in r}
    # warm-up 1, then cosine from 1e-2 at step 2 towards 0 at step 9: the new span from step 5 on
    want = {s: 1e-2 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 7)) for s in range(5, 9)}
    t.check(sorted(rates) == list(range(5, 9)) and all(abs(rates[s] - want[s]) < 1e-6 * want[s] for s in want),
            "the resumed steps run on the cosine over 8 steps: %s" % rates)

# ---- fine-tunes and evaluations in fsdp report -------------------------------------------------------------
hf = path("tiny-hf")
rc, out, err = fsdp(["export", "--checkpoint", ck, "--out", hf, "--dtype", "fp32"])
t.check(rc == 0, "export of the checkpoint (%d) %s" % (rc, err[-300:]))
results = path("results")
for run in ("finetune", os.path.join("evals", "step8")):  # made here: these checks are not --metrics's
    os.makedirs(os.path.join(results, run))
rc, out, err = fsdp(["train", "--init-from", hf, "--seq", "16", "--mbs", "2", "--steps", "2",
                     "--metrics", os.path.join(results, "finetune", "metrics.jsonl")])
t.check(rc == 0, "a fine-tune from --init-from alone (%d) %s" % (rc, err[-300:]))
if rc == 0:
    summary = t.metrics(os.path.join(results, "finetune", "metrics.jsonl"))[1]
    t.check(summary["model"] == hf, "its summary names the model it started from: %s" % summary["model"])
tokens = path("tokens.bin")
rng = __import__("random").Random(5)
packing.write_v2(tokens, [[rng.randrange(3, 1000) for _ in range(40)] for _ in range(8)], 1000, tok_hash=0x42)
rc, out, err = fsdp(["eval", "--checkpoint", ck, "--data", tokens, "--packing", "pad", "--seq", "16", "--mbs", "2",
                     "--metrics", os.path.join(results, "evals", "step8", "metrics.jsonl")])
t.check(rc == 0, "fsdp eval --metrics (%d) %s" % (rc, err[-300:]))
t.check("was trained on synthetic tokens" in out + err and tokens in out + err,
        "fsdp eval --checkpoint says the data is not what the checkpoint was trained on: %s" % (out + err)[-400:])
plots = [] if shutil.which("gnuplot") else ["--plots=no"]
rc, out, err = fsdp(["report", results, "--out", path("report")] + plots)
md = open(path("report", "report.md")).read() if rc == 0 else ""
t.check(rc == 0 and "skipped" not in err, "fsdp report reads the fine-tune and the evaluation (%d) %s" % (rc, err[-400:]))
t.check("| results/finetune | tiny-hf |" in md, "the fine-tune is in the runs table as a run of model tiny-hf")
t.check("Runs without a summary" not in md, "the evaluation is not listed as a run that stopped")
t.check("### `evals`" not in md and "loss-evals" not in " ".join(os.listdir(path("report"))),
        "the evaluation draws no one-point loss curve")
evals = re.findall(r"^\| results/evals/step8 \| (\S+) \| 8 \| (\S+) \| ([0-9.]+) \|", md, re.M)
t.check("## Evaluations" in md and len(evals) == 1 and evals[0][0].endswith("step-00000008.h5") and
        evals[0][1] == tokens, "the evaluation is listed under Evaluations: what was scored, its step, its data: %s" %
        evals)

# ---- prepare --format jsonl without the field ----------------------------------------------------------------
open(path("tok.json"), "w").write(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}))
open(path("docs.jsonl"), "w").write('{"content": "ab", "url": "x", "meta": {"n": 1}}\n')
rc, out, err = fsdp(["prepare", "--tokenizer", path("tok.json"), "--input", path("docs.jsonl"), "--format", "jsonl",
                     "--out", path("docs.bin")])
lines = error_lines(err)
t.check(rc != 0 and len(lines) == 1 and '"content", "url", "meta"' in lines[0] and "--field" in lines[0] and
        not os.path.exists(path("docs.bin")),
        "jsonl without \"text\": one line listing the record's fields: %s" % (lines[0] if lines else err[-300:]))

# ---- the job scripts outside SLURM --------------------------------------------------------------------------
fake = path("fakebin")
os.makedirs(fake)
with open(os.path.join(fake, "nvidia-smi"), "w") as f:
    f.write("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-1)'\n")
os.chmod(os.path.join(fake, "nvidia-smi"), 0o755)


def job_shell(script, **env):
    e = {k: v for k, v in t.ENV.items() if not k.startswith("SLURM_") and k not in ("RANKS", "CUDA_VISIBLE_DEVICES")}
    e.update(PATH=fake + os.pathsep + t.ENV.get("PATH", ""), FSDP_BIN=t.BIN, RESULTS_DIR=path("jobs"))
    e.update(env)
    p = subprocess.run(["bash", "-c", ". jobs/common.sh && fsdp_setup && " + script], cwd=t.ROOT, env=e,
                       capture_output=True, text=True, timeout=60)
    return p.stdout.strip(), p.stderr


for visible, want in ((None, "2"), ("1", "1"), ("0,1", "2"), ("1,-1,0", "1")):
    env = {"DEVICE": "cuda"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    got, err = job_shell('echo "$RANKS"', **env)
    t.check(got == want, "outside SLURM, 2 GPUs listed, CUDA_VISIBLE_DEVICES=%s: %s rank(s) (%s) %s" %
            (visible, want, got, err[-200:]))
got, err = job_shell("fsdp_experiment_dir ladder", DEVICE="cpu", MODEL="tiny-llama")
t.check(got == path("jobs", "ladder-tiny-llama-2cpu"), "a CPU ladder's folder says cpu, not gpu: %s %s" % (got, err))
got, err = job_shell("fsdp_experiment_dir ladder", DEVICE="cuda", MODEL="llama-3.2-1b", CUDA_VISIBLE_DEVICES="0")
t.check(got == path("jobs", "ladder-llama-3.2-1b-1gpu"), "a GPU ladder's folder says gpu: %s %s" % (got, err))

# ---- tools/fixtures.sh offline with everything there ---------------------------------------------------------
fx = path("fixtures")
os.makedirs(os.path.join(fx, "llama2"))
open(os.path.join(fx, "llama2", "tokenizer.json"), "w").write("{}")
open(os.path.join(fx, "brown.txt"), "w").write("The jury said.\n")
tools = path("offline-bin")  # no node, npm or network here; apt-get and sudo record being asked
os.makedirs(tools)
for tool in ("dirname", "mkdir", "flock", "id", "cp", "find", "sort", "xargs", "sed", "mv", "rm", "touch", "cat",
             "tar", "tail", "ls"):
    where = shutil.which(tool)
    if where:
        os.symlink(where, os.path.join(tools, tool))
asked = path("asked")
for tool in ("apt-get", "sudo"):
    with open(os.path.join(tools, tool), "w") as f:
        f.write("#!/bin/bash\necho %s \"$@\" >> %s\nexit 1\n" % (tool, asked))
    os.chmod(os.path.join(tools, tool), 0o755)
p = subprocess.run(["/bin/bash", os.path.join(t.ROOT, "tools", "fixtures.sh"), "llama2", "brown"],
                   env={"PATH": tools, "FSDP_FIXTURES": fx, "HOME": W}, capture_output=True, text=True, timeout=60)
t.check(p.returncode == 0 and p.stdout.strip().splitlines()[-1:] == [fx] and not os.path.exists(asked),
        "fixtures.sh llama2 brown with both there: nothing fetched or installed (%d, asked: %s) %s" %
        (p.returncode, open(asked).read().strip() if os.path.exists(asked) else "nothing", p.stderr[-300:]))
t.finish()
