"""--attn cudnn in training on a GPU: tiny-llama (grouped heads) trains the same losses as --attn flash
to bf16's rounding; Llama-3.2-1B with --mbs auto reserves exactly what the plan counts (cuDNN's fp32 dQ
sums and workspace in the op scratch); and every case cuDNN's graphs do not cover is refused before
anything loads, in one line naming --attn cudnn and the reason (a sliding window, attention dropout,
fp32 activations, a libcudnn that is not there); a sliding window no shorter than the sequence
runs (it masks nothing). test_gpu_backend checks the ops against the CPU.
Skipped without a GPU or in a build without cuDNN."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

if not t.has_cuda_backend():
    print("SKIPPED: no GPU, or the program has no CUDA backend")
    sys.exit(77)
TINY = ["train", "--model", "tiny-llama", "--seq", "128", "--mbs", "4", "--lr", "3e-3", "--log-every", "100",
        "--mixed-precision", "bf16"]


LAST_OUT = [""]


def train(args, tag, env=None, check=False):
    path = os.path.join(t.tmpdir("gpu-cudnn-%s" % tag), "m.jsonl")
    saved = dict(t.ENV)
    t.ENV.update(env or {})
    try:
        rc, out, err = t.run(1, args + ["--metrics", path], timeout=600, check=check, device="cuda")
    finally:
        t.ENV.clear()
        t.ENV.update(saved)
    steps, summary = t.metrics(path) if rc == 0 and os.path.exists(path) else ([], None)
    LAST_OUT[0] = out
    return rc, err, steps, summary


probe_rc, probe_err, _, _ = train(TINY + ["--steps", "1", "--attn", "cudnn"], "probe")
if probe_rc != 0 and "this build has no cuDNN" in probe_err:
    print("SKIPPED: this build has no cuDNN")
    sys.exit(77)

rc_f, err_f, flash, _ = train(TINY + ["--steps", "10", "--attn", "flash"], "flash")
rc_c, err_c, cudnn, _ = train(TINY + ["--steps", "10", "--attn", "cudnn"], "cudnn")
planned = [l for l in LAST_OUT[0].splitlines() if l.startswith("--attn cudnn: cuDNN ")]
t.check(len(planned) == 2 and "libcudnn" in planned[0] and "forward of 4 x 128 tokens" in planned[0]
        and "backward of 4 x 128 tokens" in planned[1],
        "the run says which cuDNN planned its forward and backward, once each: %r" % planned)
t.check(rc_f == 0 and rc_c == 0, "tiny-llama trains with --attn flash and cudnn (%s)" % (err_c.strip()[-300:] or "ok"))
if flash and cudnn:
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(flash, cudnn))
    t.check(len(flash) == len(cudnn) == 10 and worst < 1e-2,
            "10 steps: --attn cudnn's losses within %.2e (relative) of flash's, the first %.5f / %.5f" %
            (worst, flash[0]["loss"], cudnn[0]["loss"]))

rc, err, _, s = train(["train", "--model", "llama-3.2-1b", "--seq", "1024", "--mbs", "auto", "--steps", "2",
                       "--attn", "cudnn", "--log-every", "100"], "auto")
t.check(rc == 0 and s is not None and s["max_reserved_bytes"] == s["plan_reserved_bytes"],
        "Llama-3.2-1B --mbs auto --attn cudnn (chose %s): max reserved equals the plan's" % (s["mbs"] if s else err[-300:]))

# A sliding window at least as long as the sequence masks nothing: cuDNN's causal graph runs it
# (tiny-mistral's window is 5 tokens).
mistral = ["train", "--model", "tiny-mistral", "--seq", "5", "--mbs", "8", "--steps", "5", "--lr", "3e-3"]
rc_f, err_f, m_flash, _ = train(mistral + ["--attn", "flash"], "mistral-flash")
rc_c, err_c, m_cudnn, _ = train(mistral + ["--attn", "cudnn"], "mistral-cudnn")
t.check(rc_f == 0 and rc_c == 0 and m_flash and m_cudnn and
        max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(m_flash, m_cudnn)) < 1e-2,
        "tiny-mistral at --seq 5 (its window): --attn cudnn trains flash's losses (%s)" % (err_c.strip()[-300:] or "ok"))

refusals = [
    (["train", "--model", "tiny-mistral", "--seq", "64", "--steps", "1", "--attn", "cudnn"], None, "sliding window"),
    (TINY + ["--steps", "1", "--attn", "cudnn", "--dropout", "0.1"], None, "dropout"),
    (["train", "--model", "tiny-llama", "--seq", "64", "--steps", "1", "--attn", "cudnn", "--mixed-precision", "no"],
     None, "bf16"),
    (TINY + ["--steps", "1", "--attn", "cudnn"], {"FSDP_CUDNN_LIBRARY": "/nonexistent/libcudnn.so.9"}, "cannot load"),
]
for args, env, words in refusals:
    rc, err, _, _ = train(args, "refused", env=env)
    ours = [l for l in err.splitlines() if l.startswith("fsdp:")]
    t.check(rc == 2 and len(ours) == 1 and "--attn cudnn" in ours[0] and words in ours[0],
            "refused with exit 2 in one line naming %r: %r" % (words, ours[0] if ours else err[-300:]))
t.finish()
