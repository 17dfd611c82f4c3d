"""jobs/finetune.slurm on a real SLURM: a one-node cluster from Debian's packages (tests/lib/slurm_cluster.py)
runs the job as a user submits it, with its arguments, in CPU mode on 2 ranks: the "pretrained" model is
a tiny Llama with Llama 2's real vocabulary that fsdp.c trained briefly and exported itself (with Llama 2's
tokenizer.json beside it), the data an Alpaca JSON file of Brown-corpus sentences. Then:

  - the job completes; it prepared the data with the model's tokenizer (a training and a validation
    file, with the loss mask of Alpaca data), trained from the pretrained weights (--init-from, the
    pretrained model's first loss), evaluated every --eval-every steps and at the end, and exported;
  - the export holds config.json, model.safetensors and the tokenizer.json, and fsdp eval --init-from
    it gives the job's last validation loss;
  - --help and a missing --init-from answer at once, without SLURM.
Skips (77) only where SLURM cannot run: not root."""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import slurm_test
from slurm_cluster import SlurmError

JOB = os.path.join(t.ROOT, "jobs", "finetune.slurm")
start = time.time()
work = t.tmpdir("slurm_finetune")

# Arguments checked before anything runs, outside SLURM.
p = subprocess.run(["bash", JOB, "--help"], capture_output=True, text=True, timeout=30)
t.check(p.returncode == 0 and "--init-from DIR" in p.stdout and "#SBATCH" not in p.stdout,
        "finetune.slurm --help prints its usage")
p = subprocess.run(["bash", JOB, "--data", "x.json"], capture_output=True, text=True, timeout=30)
t.check(p.returncode == 2 and "--init-from DIR is required" in p.stderr, "a missing --init-from is one line, exit 2")

fixtures = subprocess.run(["bash", os.path.join(t.ROOT, "tools", "fixtures.sh"), "llama2", "brown"], capture_output=True,
                          text=True, check=True).stdout.strip().splitlines()[-1]
tokenizer = os.path.join(fixtures, "llama2", "tokenizer.json")

# The "pretrained" model: a tiny Llama over Llama 2's 32,000 tokens, two steps on synthetic tokens, exported.
config = os.path.join(work, "config.json")
with open(config, "w") as f:
    json.dump({"model_type": "llama", "vocab_size": 32000, "hidden_size": 16, "intermediate_size": 32,
               "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "max_position_embeddings": 128, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}, f)
pretrained = os.path.join(work, "pretrained")
t.run(2, ["train", "--model", config, "--steps", "2", "--seq", "32", "--mbs", "2", "--synthetic-vocab", "32000",
          "--ckpt-dir", os.path.join(work, "pretrain-ckpt")])
t.run(2, ["export", "--checkpoint", os.path.join(work, "pretrain-ckpt"), "--out", pretrained, "--dtype", "fp32"])
with open(tokenizer, "rb") as src, open(os.path.join(pretrained, "tokenizer.json"), "wb") as dst:
    dst.write(src.read())

# Alpaca records from the Brown corpus: the instruction a sentence's start, the output its end.
records = []
with open(os.path.join(fixtures, "brown.txt"), encoding="utf-8") as f:
    for line in f:
        words = line.split()
        if len(words) >= 12:
            records.append({"instruction": "Continue the sentence.", "input": " ".join(words[:6]),
                            "output": " ".join(words[6:24])})
        if len(records) == 60:
            break
alpaca = os.path.join(work, "brown_alpaca.json")
with open(alpaca, "w") as f:
    json.dump(records, f)

run_dir = os.path.join(work, "run")
env = slurm_test.cpu_job_env(os.path.join(work, "results"), MICRO_BATCH_SIZE="2", SEQUENCE_LEN="64",
                              MEMORY_LIMIT="0.5")
args = ["--init-from", pretrained, "--data", alpaca, "--steps", "6", "--eval-every", "3", "--lr", "1e-3", "--warmup",
        "1", "--val-fraction", "0.2", "--run-dir", run_dir]
cluster = slurm_test.start_cluster(start, gpus=2)
job = None
try:
    job = cluster.sbatch(JOB, ["--ntasks-per-node", "2", "--gres", "gpu:2", "--cpus-per-task", "1"], env=env, cwd=work,
                         script_args=args)
    state = cluster.wait(job, timeout=120)
    t.check(state == "COMPLETED" and cluster.job(job).get("ExitCode") == "0:0",
            "finetune.slurm completed (%s, %.0f s)" % (state, time.time() - start))
except SlurmError as e:
    t.fail(str(e))
finally:
    log = ""
    if job and os.path.exists(os.path.join(work, "R-fsdp-finetune.%s.out" % job)):
        with open(os.path.join(work, "R-fsdp-finetune.%s.out" % job)) as f:
            log = f.read()
    print(log[-3000:])
    cluster.stop()
t.check(not cluster.processes(), "the cluster's daemons and job processes are all gone")

# ---- what the job did
data = os.path.join(run_dir, "data")
t.check("fsdp prepare: %s (alpaca) with %s/tokenizer.json" % (alpaca, pretrained) in log,
        "it prepared the data as Alpaca (from the .json name) with the model's tokenizer")
t.check(all(os.path.isfile(os.path.join(data, f)) for f in ("train.bin", "train.val.bin")),
        "a training and a validation token file")
launch = [l for l in log.splitlines() if "srun --mpi=pmix" in l and " train " in l]
t.check(len(launch) == 1 and "--init-from %s " % pretrained in launch[0] and "--steps 6" in launch[0] and
        "--eval-data %s" % os.path.join(data, "train.val.bin") in launch[0],
        "one launch of fsdp train under srun, from the pretrained directory, evaluating (%s)" % launch)
with open(os.path.join(run_dir, "train.log")) as f:
    train_log = f.read()
t.check("init-from: %s" % pretrained in train_log and "pad: " in train_log and "loss mask" in train_log,
        "train.log: the pretrained weights loaded, the examples padded with their loss mask")
steps, summary = t.metrics(os.path.join(run_dir, "metrics.jsonl"))
losses = [r for r in steps if "loss" in r]
evals = [r for r in steps if "eval_loss" in r]
t.check([r["step"] for r in losses] == list(range(1, 7)) and summary and summary["world_size"] == 2,
        "six steps on the job's two ranks")
t.check([r["step"] for r in evals] == [3, 6], "evaluations at steps 3 and 6 (%s)" % [r["step"] for r in evals])

# The pretrained model's own loss on the first batch is the run's first loss: the weights came from it.
first = t.run(2, ["train", "--init-from", pretrained, "--data", os.path.join(data, "train.bin"), "--steps", "1",
                  "--seq", "64", "--mbs", "2", "--lr", "1e-3", "--warmup", "1", "--memory-limit", "0.5"])[1]
m = re.search(r"step 1/1 \| loss ([0-9.]+)", first)
t.check(m and losses and abs(float(m.group(1)) - losses[0]["loss"]) < 1e-3,
        "the job's first loss is the pretrained model's (%s vs %s)" % (m and m.group(1), losses and losses[0]["loss"]))

export = os.path.join(run_dir, "export")
t.check(all(os.path.isfile(os.path.join(export, f)) for f in ("config.json", "model.safetensors", "tokenizer.json")),
        "the export holds config.json, model.safetensors and the model's tokenizer.json")
t.check("== the fine-tuned model: %s" % export in log and "== all runs finished" in log, "the job names its export")
rc, out, _ = t.run(2, ["eval", "--init-from", export, "--data", os.path.join(data, "train.val.bin"), "--seq", "64"])
m = re.search(r"eval loss ([0-9.]+)", out)
t.check(m and evals and abs(float(m.group(1)) - evals[-1]["eval_loss"]) < 0.02,
        "fsdp eval --init-from the export gives the job's last validation loss (%s vs %s)" %
        (m and m.group(1), evals and evals[-1]["eval_loss"]))
# A second launch into the same folder (a new job given --run-dir, or a requeued one) goes on from the
# run's own checkpoints, with the model's shape from the pretrained directory, and replaces the export.
# It asks for 2 more steps than the checkpoint's schedule spans: --allow-schedule-change re-spans it.
p = subprocess.run(["bash", JOB] + args[:args.index("--steps")] + ["--steps", "8"] + args[args.index("--steps") + 2:],
                   env=dict(t.ENV, RANKS="2", **dict(env, EXTRA_ARGS="--allow-schedule-change")), cwd=work,
                   capture_output=True, text=True, timeout=300)
launch = [l for l in p.stdout.splitlines() if "mpirun -np 2" in l and " train " in l]
t.check(p.returncode == 0 and "== %s: prepared by an earlier launch" % data in p.stdout and len(launch) == 1 and
        "--model %s " % pretrained in launch[0] and "--resume auto" in launch[0] and "--init-from" not in launch[0] and
        re.search(r"resumed from \S*/step-00000006\.h5 at step 6 ", p.stdout) is not None and
        "== the fine-tuned model: %s" % export in p.stdout,
        "launched again, it keeps the data, resumes from step 6 to 8 and exports again (exit %d) %s" %
        (p.returncode, p.stdout[-1500:] + p.stderr[-1500:]))
print("(%.0f s)" % (time.time() - start))
t.finish()
