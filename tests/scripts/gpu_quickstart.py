"""jobs/quickstart.sh on one GPU as a user on a compute node runs it: FSDP_BIN given, the fixtures
(Llama 2's tokenizer.json and the Brown corpus) already in FSDP_FIXTURES, no network. On GPUs the job
trains its larger model (8 layers, hidden 512, 42 M parameters) for 1,200 + 200 steps of 16 x 512
tokens, which must write English after a few minutes:

  - the job fetches and installs nothing (it would fail without network) and finishes;
  - it ran the GPU model on the CUDA backend (its train.log says so);
  - the validation loss at the end is below 5.5 nats per token (the 2.3 M-parameter CPU model ends
    near 6.3, the unigram baseline is 7.07) and below the baseline it printed;
  - it took less than 6 minutes (printed: the bar is about 4);
  - the samples before and after training are printed for a reader to judge.

Skipped (77) without a GPU and the CUDA backend, or when the fixtures are not in FSDP_FIXTURES (or
build/fixtures): fill them on a machine with network with `tools/fixtures.sh llama2 brown`."""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t  # noqa: E402

if t.has_cuda_backend() < 1:
    print("gpu_quickstart: SKIPPED (needs a GPU and the CUDA backend)")
    sys.exit(77)
fixtures = os.environ.get("FSDP_FIXTURES") or os.path.join(t.ROOT, "build", "fixtures")
if not (os.path.isfile(os.path.join(fixtures, "llama2", "tokenizer.json")) and
        os.path.isfile(os.path.join(fixtures, "brown.txt"))):
    print("gpu_quickstart: SKIPPED (no llama2/tokenizer.json and brown.txt in %s: tools/fixtures.sh llama2 brown)"
          % fixtures)
    sys.exit(77)

out = t.tmpdir("gpu-quickstart")
env = dict(t.ENV, FSDP_BIN=t.BIN, FSDP_FIXTURES=fixtures, OUT=out, RANKS="1")
env.setdefault("CUDA_VISIBLE_DEVICES", "0")
start = time.time()
p = subprocess.run(["bash", os.path.join(t.ROOT, "jobs", "quickstart.sh")], env=env, capture_output=True, text=True,
                   timeout=1100)
wall = time.time() - start
print(p.stdout[-3000:])
if p.returncode != 0:
    t.fail("jobs/quickstart.sh exited %d after %.0f s:\n%s" % (p.returncode, wall, p.stderr[-3000:]))
    t.finish()
t.check("fixtures: fetching" not in p.stderr and "installing" not in p.stderr,
        "with every fixture present nothing is fetched or installed")
train_log = open(os.path.join(out, "train.log")).read()
t.check(re.search(r"model \S+: llama, 8 layers, hidden 512,", train_log) is not None and
        re.search(r"^device (?!CPU)", train_log, re.M) is not None,
        "the GPU model (8 layers, hidden 512) trained on the CUDA backend")
m = re.search(r"validation loss \(nats/token\): unigram baseline ([0-9.]+) \| step (\d+) ([0-9.]+) \| step (\d+) "
              r"([0-9.]+)", p.stdout)
t.check(m is not None, "it prints the unigram baseline and the validation losses")
if m:
    baseline, resumed = float(m.group(1)), float(m.group(5))
    t.check(resumed < 5.5 and resumed < baseline, "validation loss %.3f at step %s: below 5.5 nats and the baseline %.3f"
            % (resumed, m.group(4), baseline))
t.check(wall < 360, "the whole job took %.0f s on one GPU (bar: about 240)" % wall)
for name in ("before", "after"):
    with open(os.path.join(out, "samples", name + ".txt"), encoding="utf-8") as f:
        print("%s training: %s" % (name, f.read().strip()))
t.finish()
