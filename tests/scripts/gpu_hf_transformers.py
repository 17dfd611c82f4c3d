"""fsdp.c against transformers on a GPU: models saved by transformers load into fsdp.c and train as
transformers trains them; fsdp.c's exports load into transformers and compute the same logits.

For every family in CASES (Llama with grouped-query attention and an untied head, Llama 3 rope scaling
with a tied head, OPT, Qwen2, Qwen3 with its per-head q/k norms and a head_dim of its own, Mistral with
a sliding window shorter than the token window, trained with eager and with flash attention),
transformers makes a model with
AutoModelForCausalLM.from_config (norm weights and biases jittered so that they matter) and saves it with
save_pretrained as fp32 and bf16 files, in one file and sharded. For each of the four:

- import: `fsdp train --init-from DIR` on one GPU, fp32 (--mixed-precision no, eager attention), one
  step on one token window. Its loss must equal transformers' loss on the same tokens within 1e-5
  relative.
- gradients: both sides take the same AdamW step from the same weights: lr 1, eps 1, no weight decay,
  no clipping. With eps 1 the first step moves every weight by g / (|g| + 1), a function of the
  gradient g itself (with the usual eps the first step is about lr * sign(g)). fsdp.c's weights after
  the step (exported as fp32) minus the start weights must match transformers' update tensor by
  tensor within 1e-4 relative (the update of a tensor whose gradient is zero, OPT's k_proj.bias, is
  measured against a floor of 1e-3 of a typical tensor's update). The comparison is shown to be
  sensitive: transformers' update for shifted targets must fail it.

For the first variant of every family, the export:
- fsdp.c's export as fp32 loads with from_pretrained and its logits (GPU, fp32) match fsdp.c's logits of
  the same checkpoint (tests/tools/hf_logits, CPU fp32) within 1e-5 relative;
- the bf16 export loads as bfloat16 by default (config.json's dtype), and in fp32 matches fsdp.c's
  logits of that bf16 export within 1e-5; in bf16 it matches fsdp.c's fp32 logits within 3e-2;
- generation_config.json loads and carries the config's special token ids;
- greedy generation of 64 tokens from an 8-token prompt with `fsdp generate` (CUDA, KV cache) equals
  transformers' generate of the fp32 export (up to an end-of-sequence token, where both stop).

Needs a GPU, fsdp.c's CUDA backend, and torch + transformers (5.x) importable by the Python running
this (/usr/bin/python3 under ctest; FSDP_HF_PYTHON=/path/to/python re-runs it with another one).
Skipped (77) otherwise. Environment: FSDP_BIN, FSDP_TOOLS_DIR (hf_logits), FSDP_TEST_TMP."""
import json
import os
import struct
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import fsdptest as t

torch, transformers = t.hf_torch("gpu_hf_transformers")
import numpy as np  # transformers requires numpy
import safetensors_np as st

TOOL = os.path.join(t.TOOLS, "hf_logits")
SEQ = 32
LR, EPS = 1.0, 1.0
LOSS_TOL, UPDATE_TOL, LOGIT_TOL, BF16_LOGIT_TOL = 1e-5, 1e-4, 1e-5, 3e-2
GEN_TOKENS = 64
DEVICE = "cuda"

# One entry per family: the transformers config class and its fields; `avoid` are token ids the
# window must not hold (OPT's padding id, whose embedding row nn.Embedding(padding_idx) freezes).
CASES = [
    {"name": "llama-gqa-untied", "config": "LlamaConfig", "avoid": (),
     "fields": dict(vocab_size=384, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                    tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)},
    {"name": "llama3-rope-tied", "config": "LlamaConfig", "avoid": (),
     "fields": dict(vocab_size=384, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                    tie_word_embeddings=True, attention_dropout=0.0),
     "hint": "does fsdp.c read transformers 5's rope_parameters (rope_theta and the llama3 scaling live there)?"},
    {"name": "opt", "config": "OPTConfig", "avoid": (1,),
     "fields": dict(vocab_size=384, hidden_size=64, ffn_dim=160, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=128, word_embed_proj_dim=64, do_layer_norm_before=True, dropout=0.0,
                    attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, enable_bias=True, pad_token_id=1,
                    bos_token_id=2, eos_token_id=2)},
    {"name": "qwen2", "config": "Qwen2Config", "avoid": (), "unsupported_until": "qwen2",
     "fields": dict(vocab_size=384, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                    tie_word_embeddings=False, use_sliding_window=False, attention_dropout=0.0)},
    # Qwen3: per-head q/k norms (jittered off 1 like every 1-D weight), head_dim 24 of hidden 64 / 4
    # heads = 16, tied.
    {"name": "qwen3", "config": "Qwen3Config", "avoid": (),
     "fields": dict(vocab_size=384, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24, max_position_embeddings=128, rms_norm_eps=1e-6,
                    rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                    attention_dropout=0.0)},
    # Mistral: a sliding window of 7 keys in the 32-token window (and far below the 72 positions of
    # the generation), eager and flash.
    {"name": "mistral-window", "config": "MistralConfig", "avoid": (),
     "fields": dict(vocab_size=384, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                    sliding_window=7, tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=None,
                    eos_token_id=None)},
    {"name": "mistral-window-flash", "config": "MistralConfig", "avoid": (), "attn": "flash",
     "fields": dict(vocab_size=384, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, max_position_embeddings=128, rms_norm_eps=1e-5,
                    rope_theta=10000.0, sliding_window=5, tie_word_embeddings=True, attention_dropout=0.0,
                    bos_token_id=None, eos_token_id=None)},
]
VARIANTS = [("fp32", None), ("fp32", 60_000), ("bf16", None), ("bf16", 30_000)]  # (file dtype, max_shard_size)


def fsdp(args, check=True):
    cmd = [t.BIN] + args
    p = subprocess.run(cmd, env=t.ENV, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise RuntimeError("exit %d: %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout[-2000:], p.stderr[-2000:]))
    return p


def make_model(case, dtype, shard, path):
    torch.manual_seed(0)
    cfg = getattr(transformers, case["config"])(**case["fields"])
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))  # norm weights and biases away from 1 and 0
    model = model.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)


def load(path, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.to(DEVICE).eval()


def window(case, vocab):
    rng = np.random.default_rng(1)
    ids = [i for i in rng.integers(3, vocab, 4 * SEQ).tolist() if i not in case["avoid"]][:SEQ + 1]
    return np.array(ids, dtype=np.int64)


def token_file(path, ids, vocab):
    with open(path, "wb") as f:
        f.write(b"FSDPTOK\0" + struct.pack("<IIQQ", 1, 2, ids.size, vocab) + bytes(32))
        f.write(ids.astype(np.uint16).tobytes())


def loss_and_update(model, ids, targets):
    """transformers' loss and the AdamW update (W_after - W_before) of every parameter, by name."""
    params = dict(model.named_parameters())
    before = {k: p.detach().clone() for k, p in params.items()}
    logits = model(input_ids=torch.tensor(ids[None], device=DEVICE)).logits[0].float()
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets, device=DEVICE))
    model.zero_grad()
    loss.backward()
    opt = torch.optim.AdamW([p for p in model.parameters()], lr=LR, betas=(0.9, 0.999), eps=EPS, weight_decay=0.0,
                            foreach=False)
    opt.step()
    update = {k: (p.detach() - before[k]).double().cpu().numpy() for k, p in params.items()}
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(before[k])
    return float(loss), update, {k: v.double().cpu().numpy() for k, v in before.items()}


def compare_updates(fsdp_update, hf_update, start):
    """Worst relative difference over tensors (names as in the files; a tied head is the embedding).
    Both updates are differences of fp32 weights (after - before), so each carries the rounding of the
    stored weight, up to half an fp32 ulp of |w| per element: that much difference (twice, one per side)
    is not counted. It matters for tensors whose update is tiny next to the weights (OPT's q_proj of
    the last layer, whose attention is nearly uniform at initialisation: measured 1e-4 without it)."""
    norms = [np.linalg.norm(v) for v in hf_update.values()]
    floor = 1e-3 * float(np.mean(norms))
    worst, where = 0.0, None
    for k, v in hf_update.items():
        if k not in fsdp_update:
            continue  # lm_head.weight of a tied model: the same parameter as the embedding
        rounding = 2.0 * 2.0 ** -24 * np.linalg.norm(start[k])
        r = max(0.0, np.linalg.norm(fsdp_update[k] - v) - rounding) / max(np.linalg.norm(v), floor)
        if r > worst:
            worst, where = r, k
    missing = [k for k in fsdp_update if k not in hf_update]
    return worst, where, missing


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids[None], device=DEVICE)).logits[0].float().cpu().numpy()


def fsdp_logits(source, ids, vocab, d, tag):
    tok, out = os.path.join(d, "logits-%s.tokens" % tag), os.path.join(d, "logits-%s.bin" % tag)
    ids.astype("<i4").tofile(tok)
    p = subprocess.run([TOOL, source, tok, str(ids.size), out], env=t.ENV, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("hf_logits failed: %s%s" % (p.stdout, p.stderr))
    return np.fromfile(out, dtype="<f4").reshape(ids.size, vocab)


def rel(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def run_variant(case, dtype, shard, d, first):
    name = "%s, %s file%s" % (case["name"], dtype, ", sharded" if shard else "")
    src = os.path.join(d, "hf")
    make_model(case, dtype, shard, src)
    files = [f for f in os.listdir(src) if f.endswith(".safetensors")]
    if bool(shard) != (len(files) > 1):
        t.fail("%s: save_pretrained wrote %d weight files" % (name, len(files)))
    vocab = case["fields"]["vocab_size"]
    ids = window(case, vocab)
    data = os.path.join(d, "tokens.bin")
    token_file(data, ids, vocab)
    ck, metrics = os.path.join(d, "ck"), os.path.join(d, "m.jsonl")
    p = fsdp(["train", "--init-from", src, "--data", data, "--seq", str(SEQ), "--mbs", "1", "--steps", "1",
              "--lr", str(LR), "--adam-eps", str(EPS), "--clip", "0", "--weight-decay", "0", "--model-precision", "fp32",
              "--mixed-precision", "no", "--attn", case.get("attn", "eager"), "--device", "cuda", "--ckpt-dir", ck,
              "--metrics", metrics],
             check=False)
    if p.returncode != 0 and case.get("unsupported_until") and "not supported" in p.stderr and \
            case["unsupported_until"] in p.stderr:
        print("SKIPPED %s: this fsdp.c does not train it yet (%s)" % (name, p.stderr.strip().splitlines()[-1]))
        return
    if p.returncode != 0:
        raise RuntimeError("fsdp train --init-from failed:\n" + p.stdout[-2000:] + p.stderr[-2000:])
    fsdp_loss = t.metrics(metrics)[0][0]["loss"]

    model = load(src)
    hf_loss, hf_update, start = loss_and_update(model, ids[:-1], ids[1:])
    hint = (" (hint: " + case["hint"] + ")") if case.get("hint") else ""
    r = abs(fsdp_loss - hf_loss) / abs(hf_loss)
    t.check(r <= LOSS_TOL, "%s: first-step loss %.7f vs transformers %.7f (relative %.1e <= %.0e)%s" %
            (name, fsdp_loss, hf_loss, r, LOSS_TOL, "" if r <= LOSS_TOL else hint))

    exp32 = os.path.join(d, "export-fp32")
    fsdp(["export", "--checkpoint", ck, "--out", exp32, "--dtype", "fp32"])
    after, _, _, _ = st.read(os.path.join(exp32, "model.safetensors"))
    fsdp_update = {k: st.to_f32(v[0], v[2]).astype(np.float64) - start[k] for k, v in after.items()}
    worst, where, missing = compare_updates(fsdp_update, hf_update, start)
    t.check(not missing and worst <= UPDATE_TOL, "%s: AdamW updates (gradients) match transformers' tensor by tensor "
            "(worst %.1e at %s <= %.0e)%s" % (name, worst, where, UPDATE_TOL, " missing: %s" % missing if missing else ""))
    _, shifted, _ = loss_and_update(model, ids[:-1], np.roll(ids[1:], 1))
    worse, _, _ = compare_updates(fsdp_update, shifted, start)
    t.check(worse > UPDATE_TOL, "%s: the update comparison is sensitive (shifted targets: %.1e)" % (name, worse))
    if first:
        check_export(case, name, ck, exp32, ids[:-1], vocab, d)


def check_export(case, name, ck, exp32, ids, vocab, d):
    ref = fsdp_logits(os.path.join(ck, "step-00000001.h5"), ids, vocab, d, "ckpt")
    got = logits_of(load(exp32), ids)
    t.check(rel(got, ref) <= LOGIT_TOL, "%s: fp32 export: transformers' logits match fsdp.c's (relative %.1e <= %.0e)" %
            (name, rel(got, ref), LOGIT_TOL))
    exp16 = os.path.join(d, "export-bf16")
    fsdp(["export", "--checkpoint", ck, "--out", exp16, "--dtype", "bf16", "--max-shard-size", "40KB"])
    auto = transformers.AutoModelForCausalLM.from_pretrained(exp16)
    t.check(auto.dtype == torch.bfloat16, "%s: the bf16 export loads as %s by default" % (name, auto.dtype))
    ref16 = fsdp_logits(exp16, ids, vocab, d, "bf16")
    got16 = logits_of(load(exp16), ids)
    t.check(rel(got16, ref16) <= LOGIT_TOL, "%s: sharded bf16 export, computed in fp32: logits match fsdp.c's of the "
            "same file (relative %.1e <= %.0e)" % (name, rel(got16, ref16), LOGIT_TOL))
    native = logits_of(load(exp16, torch.bfloat16), ids)
    t.check(rel(native, ref) <= BF16_LOGIT_TOL, "%s: bf16 export in bf16: logits within %.0e of fsdp.c's fp32 ones "
            "(relative %.1e)" % (name, BF16_LOGIT_TOL, rel(native, ref)))
    gen = transformers.GenerationConfig.from_pretrained(exp32)
    cfg = json.load(open(os.path.join(exp32, "config.json")))
    t.check(all(getattr(gen, k, None) == cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")),
            "%s: generation_config.json carries the special token ids" % name)
    check_generation(name, exp32, ids[:8].tolist(), cfg)


def until_eos(ids, eos):
    """The tokens up to and including the first end-of-sequence token (both sides stop there)."""
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    for i, x in enumerate(ids):
        if x in eos:
            return ids[:i + 1]
    return ids


def check_generation(name, exp32, prompt, cfg):
    """Greedy generation of GEN_TOKENS from the fp32 export: fsdp generate (CUDA, KV cache) against
    transformers' generate (fp32, eager attention, its own cache)."""
    p = fsdp(["generate", "--init-from", exp32, "--prompt-ids", " ".join(map(str, prompt)), "--print-ids",
              "--max-new-tokens", str(GEN_TOKENS), "--temperature", "0", "--device", "cuda", "--dtype", "fp32"])
    got = [int(x) for x in p.stdout.split()]
    model = load(exp32)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=GEN_TOKENS, do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
    ref = out.sequences[0, len(prompt):].tolist()
    eos = cfg.get("eos_token_id")
    got, ref = until_eos(got, eos), until_eos(ref, eos)
    at = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
    if at is None and len(got) != len(ref):
        at = min(len(got), len(ref))
    margin = ""
    if at is not None and at < len(out.scores):
        top = torch.topk(out.scores[at][0].float(), 2).values
        margin = "; transformers' top-1/top-2 margin there %.3g" % float(top[0] - top[1])
    t.check(at is None, "%s: greedy generation of %d tokens equals transformers' (%d distinct)%s" %
            (name, len(ref), len(set(ref)), "" if at is None else "; first difference at new token %d: fsdp %s, "
             "transformers %s%s" % (at, got[at:at + 4], ref[at:at + 4], margin)))


if not os.path.exists(TOOL):
    t.fail("%s is missing (build the tests: it is tests/tools/hf_logits.c)" % TOOL)
    t.finish()
print("transformers %s, torch %s, %s" % (transformers.__version__, torch.__version__, torch.cuda.get_device_name()))
for case in CASES:
    for i, (dtype, shard) in enumerate(VARIANTS):
        d = t.tmpdir("gpu-hf-%s-%s-%s" % (case["name"], dtype, shard or "single"))
        try:
            run_variant(case, dtype, shard, d, i == 0)
        except Exception:
            t.fail("%s, %s, shard %s: %s" % (case["name"], dtype, shard, traceback.format_exc()))
t.finish()
