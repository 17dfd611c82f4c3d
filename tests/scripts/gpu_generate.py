"""`fsdp generate` against transformers' generate: greedy decoding token for token over 64 new tokens.

For Llama (grouped-query attention, untied head), OPT (learned positions, biases) and Qwen2 (q/k/v
biases), transformers makes a model with AutoModelForCausalLM.from_config (torch seed 0,
initializer_range 0.2 so that a random model writes varied tokens with clear margins instead of
repeating one, norm weights and biases jittered so that they matter; hidden 512, 4 layers, head dim
64, vocabulary 32,000, no eos_token_id so that both sides run all 64 tokens) and saves it in fp32
with save_pretrained. transformers' generate(do_sample=False, max_new_tokens=64) in fp32 on the GPU
(eager attention, TF32 off) gives the reference; `fsdp generate --temperature 0 --dtype fp32` must
give the same 64 ids on the CPU and on the GPU. Where they differ, the first position, both ids and
transformers' top-1/top-2 logit margin there are printed, so that a real difference can be told from
a near-tie; the smallest margin over the 64 steps is printed in every case. bf16 on the GPU is run
too and its agreement reported (not required: bf16 rounding flips near-ties), with fsdp.c's
tokens/s.

Needs a GPU, fsdp.c's CUDA backend and torch + transformers importable by the Python that runs this
(/usr/bin/python3 under ctest; FSDP_HF_PYTHON=/path/to/python re-runs it with another). Skipped (77)
otherwise."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import fsdptest as t

torch, transformers = t.hf_torch("gpu_generate")

NEW = 64
PROMPT = [1, 450, 4996, 338, 263, 1243, 310, 278, 3186, 29892, 322, 372]

SHAPE = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
             max_position_embeddings=512, eos_token_id=None)
CASES = [
    ("llama-gqa", "LlamaConfig", dict(intermediate_size=1376, num_key_value_heads=2, rms_norm_eps=1e-5,
                                      rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2,
                                      bos_token_id=1)),
    ("opt", "OPTConfig", dict(ffn_dim=1024, word_embed_proj_dim=512, do_layer_norm_before=True, dropout=0.0,
                              attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, enable_bias=True,
                              init_std=0.2, pad_token_id=1, bos_token_id=2)),
    ("qwen2", "Qwen2Config", dict(intermediate_size=1376, num_key_value_heads=2, rms_norm_eps=1e-6,
                                  rope_theta=10000.0, tie_word_embeddings=False, use_sliding_window=False,
                                  initializer_range=0.2)),
]


def make_model(config_class, fields, path):
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(**dict(SHAPE, **fields))
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.to(torch.float32).save_pretrained(path)


def reference(path):
    """transformers' greedy ids and the top-1/top-2 margin of each step's logits."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model = model.to("cuda").eval()
    ids = torch.tensor([PROMPT], device="cuda")
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                             output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, len(PROMPT):].tolist()
    top = torch.stack([l[0].float() for l in out.logits]).topk(2, dim=-1).values
    margins = (top[:, 0] - top[:, 1]).tolist()
    del model
    torch.cuda.empty_cache()
    return new, margins


def fsdp_greedy(path, device, dtype):
    cmd = [t.BIN, "generate", "--init-from", path, "--prompt-ids", " ".join(map(str, PROMPT)), "--temperature", "0",
           "--max-new-tokens", str(NEW), "--print-ids", "--device", device, "--dtype", dtype]
    p = subprocess.run(cmd, env=t.ENV, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        t.fail("exit %d: %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
        return None, ""
    return [int(x) for x in p.stdout.split()], p.stderr.strip().splitlines()[-1]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


d = t.tmpdir("gpu_generate")
for name, config_class, fields in CASES:
    path = os.path.join(d, name)
    make_model(config_class, fields, path)
    ref, margins = reference(path)
    print("%s: transformers' greedy: %d tokens, %d distinct, smallest top-1/top-2 margin %.4g (step %d)"
          % (name, len(ref), len(set(ref)), min(margins), margins.index(min(margins))), flush=True)
    t.check(len(ref) == NEW, "%s: transformers generated all %d tokens" % (name, NEW))
    for device, dtype in (("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16")):
        got, speed = fsdp_greedy(path, device, dtype)
        if got is None:
            continue
        at = first_difference(got, ref)
        where = "" if at is None else "; first difference at new token %d: fsdp.c %s, transformers %s (margin there %.4g)" % (
            at, got[at:at + 3], ref[at:at + 3], margins[at] if at < len(margins) else float("nan"))
        line = "%s, %s %s: %d of %d tokens equal transformers' greedy%s" % (
            name, device, dtype, len(got) if at is None else at, NEW, where)
        if dtype == "bf16":
            print("info: " + line + " (bf16: reported, not required)", flush=True)
        else:
            t.check(at is None, line)
        print("      " + speed, flush=True)

t.finish()
