"""Independent float64 PyTorch reference for fsdp.c's Llama and OPT models.

Written from the published architectures as Hugging Face's LlamaForCausalLM and OPTForCausalLM
compute them (without importing transformers, and sharing no code with fsdp.c). It reads the
weights of an oracle_dump file by their Hugging Face names, runs one forward and backward in
float64, and returns the logits, the loss and d loss / d param for every parameter.

Only plain torch operations are used (torch 1.13 as Debian ships it: no
scaled_dot_product_attention). The loss is the mean cross-entropy over the positions whose label
is not -1, with no shift (the dumped labels are already the next tokens).

`mutations` (a set of names from MUTATIONS) deliberately breaks the reference in one known way; it
exists only so that the test can prove that the comparison is sensitive to such bugs. The normal
path passes none.
"""

import json
import math

import h5py
import numpy as np
import torch

DTYPE = torch.float64
IGNORE_INDEX = -1

# Deliberate bugs the test plants in the reference to prove that the comparison would catch them.
MUTATIONS = {
    "rope_no_llama3": "llama: ignore rope_scaling (plain inv_freq, no llama3 adjustment)",
    "rope_interleaved": "llama: rotate adjacent pairs (GPT-J convention) instead of rotate_half",
    "gqa_modulo": "llama: query head h uses kv head h % Hkv instead of h // (Hq/Hkv)",
    "rms_eps_outside": "llama: RMSNorm as x / (sqrt(mean(x^2)) + eps)",
    "opt_no_offset": "opt: positional embedding indexed by position (no +2 offset)",
    "no_causal": "both: attention without the causal mask",
    "loss_sum": "both: loss summed instead of averaged over counted positions",
    "silu_to_gelu": "llama: GELU instead of SiLU in the MLP gate",
    "tied_head_detached": "both: tied head does not send its gradient into the embedding",
    "ln_unbiased_var": "opt: LayerNorm with the unbiased (n-1) variance",
}


# ----------------------------------------------------------------------------------------------
# Dump file


def load_dump(path):
    """Reads an oracle_dump file into plain numpy / python objects."""
    with h5py.File(path, "r") as f:
        raw = f.attrs["config"]
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8")
        out = {
            "config": json.loads(raw),
            "input_ids": np.asarray(f["input_ids"][...], dtype=np.int64),
            "labels": np.asarray(f["labels"][...], dtype=np.int64),
            "logits": np.asarray(f["logits"][...]),
            "loss": float(np.asarray(f["loss"][...]).reshape(-1)[0]),
            "params": {k: np.asarray(v[...]) for k, v in f["param"].items()} if "param" in f else {},
            "grads": {k: np.asarray(v[...]) for k, v in f["grad"].items()} if "grad" in f else {},
        }
    return out


# ----------------------------------------------------------------------------------------------
# Expected parameters (names and shapes) of each architecture


def _llama_dims(cfg):
    C = cfg["hidden_size"]
    Hq = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or Hq
    D = cfg.get("head_dim") or C // Hq
    return C, Hq, Hkv, D


def expected_params(cfg):
    """{HF name: shape} of every trainable parameter the architecture has."""
    mt = cfg["model_type"]
    V, C, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    tied = cfg.get("tie_word_embeddings", True)
    shapes = {}
    if mt == "llama":
        _, Hq, Hkv, D = _llama_dims(cfg)
        F = cfg["intermediate_size"]
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ValueError("the reference implements Llama without attention or MLP biases")
        shapes["model.embed_tokens.weight"] = (V, C)
        for i in range(L):
            p = "model.layers.%d." % i
            shapes[p + "input_layernorm.weight"] = (C,)
            shapes[p + "self_attn.q_proj.weight"] = (Hq * D, C)
            shapes[p + "self_attn.k_proj.weight"] = (Hkv * D, C)
            shapes[p + "self_attn.v_proj.weight"] = (Hkv * D, C)
            shapes[p + "self_attn.o_proj.weight"] = (C, Hq * D)
            shapes[p + "post_attention_layernorm.weight"] = (C,)
            shapes[p + "mlp.gate_proj.weight"] = (F, C)
            shapes[p + "mlp.up_proj.weight"] = (F, C)
            shapes[p + "mlp.down_proj.weight"] = (C, F)
        shapes["model.norm.weight"] = (C,)
    elif mt == "opt":
        F = cfg["ffn_dim"]
        bias = cfg.get("enable_bias", True)
        affine = cfg.get("layer_norm_elementwise_affine", True)
        if not cfg.get("do_layer_norm_before", True):
            raise ValueError("the reference implements pre-LayerNorm OPT only")
        if cfg.get("word_embed_proj_dim", C) != C:
            raise ValueError("the reference implements OPT without project_in/project_out")
        d = "model.decoder."
        shapes[d + "embed_tokens.weight"] = (V, C)
        shapes[d + "embed_positions.weight"] = (cfg["max_position_embeddings"] + 2, C)

        def ln(name):
            if affine:
                shapes[name + ".weight"] = (C,)
                shapes[name + ".bias"] = (C,)

        def lin(name, out_f, in_f):
            shapes[name + ".weight"] = (out_f, in_f)
            if bias:
                shapes[name + ".bias"] = (out_f,)

        for i in range(L):
            p = d + "layers.%d." % i
            ln(p + "self_attn_layer_norm")
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                lin(p + "self_attn." + proj, C, C)
            ln(p + "final_layer_norm")
            lin(p + "fc1", F, C)
            lin(p + "fc2", C, F)
        ln(d + "final_layer_norm")
    else:
        raise ValueError("unsupported model_type %r" % mt)
    if not tied:
        shapes["lm_head.weight"] = (V, C)
    return shapes


# ----------------------------------------------------------------------------------------------
# Building blocks


def linear(x, w, b=None):
    y = x.matmul(w.t())
    return y + b if b is not None else y


def rms_norm(x, w, eps, mutations):
    if "rms_eps_outside" in mutations:
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, w, b, eps, mutations):
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)  # biased variance, as torch.nn.LayerNorm
    if "ln_unbiased_var" in mutations:
        var = var * x.shape[-1] / (x.shape[-1] - 1)
    y = (x - mu) * torch.rsqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def causal_attention(q, k, v, scale, mutations):
    """q [B, Hq, T, D]; k, v [B, Hq, T, D] (kv heads already expanded). Returns [B, Hq, T, D]."""
    T = q.shape[2]
    scores = q.matmul(k.transpose(-1, -2)) * scale
    if "no_causal" not in mutations:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1).matmul(v)


def rope_inv_freq(cfg, D, mutations):
    """inv_freq [D/2] of Llama's rotary embedding, with the llama3 adjustment where configured."""
    theta = float(cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, dtype=DTYPE) / D)
    rs = cfg.get("rope_scaling")
    if rs is None or "rope_no_llama3" in mutations:
        return inv_freq
    rope_type = rs.get("rope_type", rs.get("type"))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError("unsupported rope_scaling type %r" % rope_type)
    # transformers' _compute_llama3_parameters.
    factor = float(rs["factor"])
    low = float(rs["low_freq_factor"])
    high = float(rs["high_freq_factor"])
    original = float(rs["original_max_position_embeddings"])
    low_freq_wavelen = original / low
    high_freq_wavelen = original / high
    out = []
    for f in inv_freq.tolist():
        wavelen = 2.0 * math.pi / f
        if wavelen > low_freq_wavelen:
            out.append(f / factor)
        elif wavelen < high_freq_wavelen:
            out.append(f)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1.0 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=DTYPE)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin, mutations):
    """x [B, H, T, D]; cos, sin [T, D/2]."""
    if "rope_interleaved" in mutations:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        r1 = x1 * cos - x2 * sin
        r2 = x2 * cos + x1 * sin
        return torch.stack((r1, r2), dim=-1).flatten(-2)
    cos2 = torch.cat((cos, cos), dim=-1)
    sin2 = torch.cat((sin, sin), dim=-1)
    return x * cos2 + rotate_half(x) * sin2


def cross_entropy_mean(logits, labels, mutations):
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    lab = labels.reshape(-1)
    keep = lab != IGNORE_INDEX
    logp = torch.log_softmax(flat[keep], dim=-1)
    nll = -logp.gather(1, lab[keep].unsqueeze(1)).squeeze(1)
    return nll.sum() if "loss_sum" in mutations else nll.sum() / keep.sum()


# ----------------------------------------------------------------------------------------------
# Models


def llama_forward(cfg, P, input_ids, mutations=frozenset()):
    C, Hq, Hkv, D = _llama_dims(cfg)
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    B, T = input_ids.shape
    if Hq % Hkv:
        raise ValueError("num_key_value_heads must divide num_attention_heads")
    group = Hq // Hkv
    if "gqa_modulo" in mutations:
        kv_of_head = torch.tensor([h % Hkv for h in range(Hq)])
    else:
        kv_of_head = torch.tensor([h // group for h in range(Hq)])

    inv_freq = rope_inv_freq(cfg, D, mutations)
    pos = torch.arange(T, dtype=DTYPE)
    freqs = pos[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = freqs.cos(), freqs.sin()

    act = torch.nn.functional.gelu if "silu_to_gelu" in mutations else torch.nn.functional.silu
    x = P["model.embed_tokens.weight"][input_ids]  # [B, T, C]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps, mutations)
        q = linear(h, P[p + "self_attn.q_proj.weight"]).view(B, T, Hq, D).transpose(1, 2)
        k = linear(h, P[p + "self_attn.k_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
        v = linear(h, P[p + "self_attn.v_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
        q = apply_rope(q, cos, sin, mutations)
        k = apply_rope(k, cos, sin, mutations)
        k = k[:, kv_of_head]  # [B, Hq, T, D]
        v = v[:, kv_of_head]
        a = causal_attention(q, k, v, 1.0 / math.sqrt(D), mutations)
        a = a.transpose(1, 2).reshape(B, T, Hq * D)
        x = x + linear(a, P[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps, mutations)
        m = act(linear(h, P[p + "mlp.gate_proj.weight"])) * linear(h, P[p + "mlp.up_proj.weight"])
        x = x + linear(m, P[p + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"], eps, mutations)
    head = P["lm_head.weight"] if "lm_head.weight" in P else P["model.embed_tokens.weight"]
    if "tied_head_detached" in mutations:
        head = head.detach()
    return linear(x, head)


def opt_forward(cfg, P, input_ids, mutations=frozenset()):
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    D = C // H
    eps = 1e-5  # OPT's LayerNorms use torch's default epsilon
    B, T = input_ids.shape
    d = "model.decoder."

    def g(name):
        return P.get(name)

    def ln(x, name):  # weight and bias are absent when layer_norm_elementwise_affine is false
        return layer_norm(x, g(name + ".weight"), g(name + ".bias"), eps, mutations)

    # OPTLearnedPositionalEmbedding: with no padding the positions are 0..T-1, shifted by offset 2.
    offset = 0 if "opt_no_offset" in mutations else 2
    positions = torch.arange(T) + offset
    x = P[d + "embed_tokens.weight"][input_ids] + P[d + "embed_positions.weight"][positions][None]
    for i in range(L):
        p = d + "layers.%d." % i
        h = ln(x, p + "self_attn_layer_norm")
        a = p + "self_attn."
        q = linear(h, P[a + "q_proj.weight"], g(a + "q_proj.bias")) * D ** -0.5
        k = linear(h, P[a + "k_proj.weight"], g(a + "k_proj.bias"))
        v = linear(h, P[a + "v_proj.weight"], g(a + "v_proj.bias"))
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        o = causal_attention(q, k, v, 1.0, mutations).transpose(1, 2).reshape(B, T, C)
        x = x + linear(o, P[a + "out_proj.weight"], g(a + "out_proj.bias"))
        h = ln(x, p + "final_layer_norm")
        h = torch.relu(linear(h, P[p + "fc1.weight"], g(p + "fc1.bias")))
        x = x + linear(h, P[p + "fc2.weight"], g(p + "fc2.bias"))
    x = ln(x, d + "final_layer_norm")
    head = P["lm_head.weight"] if "lm_head.weight" in P else P[d + "embed_tokens.weight"]
    if "tied_head_detached" in mutations:
        head = head.detach()
    return linear(x, head)


def run_reference(cfg, params, input_ids, labels, mutations=frozenset()):
    """Forward and backward in float64.

    cfg: the Hugging Face config dict; params: {HF name: numpy array}, exactly the names of
    expected_params(cfg); input_ids, labels: integer arrays [B, T].
    Returns (logits numpy [B, T, V], loss float, {HF name: gradient numpy array}).
    """
    unknown = set(mutations) - set(MUTATIONS)
    if unknown:
        raise ValueError("unknown mutations: %s" % sorted(unknown))
    want = expected_params(cfg)
    missing = sorted(set(want) - set(params))
    extra = sorted(set(params) - set(want))
    if missing or extra:
        raise ValueError("parameter names differ from the architecture: missing %s, unexpected %s"
                         % (missing, extra))
    P = {}
    for name, shape in want.items():
        if tuple(params[name].shape) != tuple(shape):
            raise ValueError("%s has shape %s, the architecture says %s" % (name, params[name].shape, shape))
        P[name] = torch.tensor(np.asarray(params[name], dtype=np.float64), dtype=DTYPE, requires_grad=True)
    ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
    lab = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    if cfg["model_type"] == "llama":
        logits = llama_forward(cfg, P, ids, mutations)
    else:
        logits = opt_forward(cfg, P, ids, mutations)
    loss = cross_entropy_mean(logits, lab, mutations)
    loss.backward()
    grads = {}
    for n, t in P.items():  # a parameter the loss does not reach has a zero gradient
        grads[n] = t.grad.detach().numpy().copy() if t.grad is not None else np.zeros(t.shape)
    return logits.detach().numpy(), float(loss.item()), grads


def reference_from_dump(dump, mutations=frozenset()):
    """run_reference on the weights and batch of a load_dump() result."""
    return run_reference(dump["config"], dump["params"], dump["input_ids"], dump["labels"], mutations)
