"""Independent float64 PyTorch reference for fsdp.c's Llama, Qwen2, Qwen3, Mistral and OPT models.

Written from the published architectures as Hugging Face's LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, MistralForCausalLM and OPTForCausalLM compute them (without importing transformers, and sharing no code with fsdp.c). It
reads the weights of an oracle_dump file by their Hugging Face names, runs one forward and backward
in float64, and returns the logits, the loss and d loss / d param for every parameter.

Config fields are read the way transformers reads them, with its defaults: RoPE from rope_scaling
and rope_theta (transformers 4) or rope_parameters (5); the biases of Llama's attention_bias (q, k,
v, o) and mlp_bias, Qwen2's fixed q/k/v biases and OPT's enable_bias; the token embedding as
nn.Embedding(padding_idx=pad_token_id), whose pad row gets no gradient from input tokens. Qwen3
(modeling_qwen3.py): Qwen3RMSNorm(head_dim) on every query and key head (q_norm, k_norm) after the
projections and before RoPE, head_dim its own field (default 128), attention_bias on q, k, v and o.
Mistral (modeling_mistral.py): sliding_window (4096 when absent, none when null) masks every key j
with j <= i - sliding_window for query i, as transformers' sliding-window mask (kv_idx > q_idx -
sliding_window) does with sdpa and eager attention.

Dropout, when the dump is a training pass (it then carries `dropout_seed` and `sample_base`), is
applied where transformers applies it in training: OPT's `dropout` on the attention block's output
(after out_proj) and on the MLP's output (after fc2), each before its residual add, and every
family's `attention_dropout` on the softmax probabilities before they multiply V; never on the
embeddings, and never OPT's `activation_dropout` (OPTDecoderLayer does not use it). Which elements
are kept is fsdp.c's documented definition (docs/DESIGN.md, "Dropout masks"): Philox-4x32-10,
implemented here a second time from the paper's constants and checked against Random123's
known answers, keyed by the seed, with the counter holding the global sample index, the layer, the
site and the element's position in that sample's tensor. The rate is used as the float32 value
fsdp.c stores, kept values are scaled by 1 / (1 - p).

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

from dropout_masks import SITE_ATTN_OUT, SITE_MLP_OUT, NoDropout, dropout_of, philox_known_answers  # noqa: F401

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
    "qwen2_no_qkv_bias": "qwen2: q, k and v projections without their biases",
    "attn_bias_not_on_o": "llama: attention_bias on q, k and v only (as Qwen2), not on o_proj",
    "pad_row_input_grad": "all: the padding_idx row gets a gradient from input tokens",
    "rope_no_linear": "llama/qwen2: ignore linear rope scaling",
    "dropout_not_in_backward": "dropout: masks applied in the forward only (gradients pass unmasked)",
    "dropout_other_sample": "dropout: the masks of the next sample (global sample index + 1)",
    "dropout_no_scale": "dropout: kept values not scaled by 1 / (1 - p)",
    "dropout_sites_swapped": "opt dropout: the attention output drawn with the MLP output's mask and vice versa",
    "dropout_probs_transposed": "attention dropout: the mask of (key, query) on (query, key)",
    "qk_norm_after_rope": "qwen3: q_norm and k_norm applied after the rotary embedding instead of before",
    "qk_norm_shared": "qwen3: the keys normalised with q_norm's weights",
    "no_window": "mistral: sliding_window ignored (plain causal attention)",
    "window_one_wider": "mistral: query i also sees key i - sliding_window",
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
            "training": {"seed": int(f.attrs["dropout_seed"]), "sample_base": int(f.attrs["sample_base"])}
            if "dropout_seed" in f.attrs else None,
        }
    return out


# ----------------------------------------------------------------------------------------------
# Expected parameters (names and shapes) of each architecture


LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral")
# The special token defaults of each config class (OPTConfig pads with token 1).
PAD_DEFAULT = {"llama": None, "qwen2": None, "qwen3": None, "mistral": None, "opt": 1}
TIE_DEFAULT = {"llama": False, "qwen2": False, "qwen3": False, "mistral": False, "opt": True}
# num_key_value_heads when the field is absent (an explicit null means num_attention_heads).
KV_DEFAULT = {"qwen2": 32, "qwen3": 32, "mistral": 8}


def _llama_dims(cfg):
    C = cfg["hidden_size"]
    Hq = cfg["num_attention_heads"]
    mt = cfg["model_type"]
    if "num_key_value_heads" not in cfg and mt in KV_DEFAULT:
        Hkv = KV_DEFAULT[mt]
    else:
        Hkv = cfg.get("num_key_value_heads") or Hq
    if mt == "qwen3" and "head_dim" not in cfg:
        D = 128  # Qwen3Config's default, whatever hidden_size / heads is
    else:
        D = cfg.get("head_dim") or C // Hq
    return C, Hq, Hkv, D


def sliding_window(cfg):
    """Mistral's window (MistralConfig: 4096 when absent, none when null), else None."""
    if cfg["model_type"] != "mistral":
        return None
    w = cfg.get("sliding_window", 4096)
    return None if w is None else int(w)


def biases(cfg):
    """(q/k/v, o, mlp): which projections of a llama-like block carry a bias."""
    if cfg["model_type"] == "qwen2":
        return True, False, False  # Qwen2Attention hard-codes them
    if cfg["model_type"] == "mistral":
        return False, False, False  # MistralAttention and MistralMLP have none
    attn = bool(cfg.get("attention_bias", False))
    mlp = bool(cfg.get("mlp_bias", False)) if cfg["model_type"] == "llama" else False
    return attn, attn, mlp


def padding_idx(cfg):
    pad = cfg.get("pad_token_id", PAD_DEFAULT[cfg["model_type"]])
    return None if pad is None else int(pad)


def rope_settings(cfg):
    """{"theta", "type", ...} as transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters) say."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = float(scaling.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    out = {"theta": theta, "type": scaling.get("rope_type", scaling.get("type", "default"))}
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        if k in scaling:
            out[k] = float(scaling[k])
    if out["type"] == "llama3":
        out["original_max_position_embeddings"] = float(
            scaling.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
    return out


def expected_params(cfg):
    """{HF name: shape} of every trainable parameter the architecture has."""
    mt = cfg["model_type"]
    V, C, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    tied = cfg.get("tie_word_embeddings", TIE_DEFAULT[mt])
    shapes = {}
    if mt in LLAMA_LIKE:
        _, Hq, Hkv, D = _llama_dims(cfg)
        F = cfg["intermediate_size"]
        qkv_bias, o_bias, mlp_bias = biases(cfg)

        def lin(name, out_f, in_f, bias):
            shapes[name + ".weight"] = (out_f, in_f)
            if bias:
                shapes[name + ".bias"] = (out_f,)

        shapes["model.embed_tokens.weight"] = (V, C)
        for i in range(L):
            p = "model.layers.%d." % i
            shapes[p + "input_layernorm.weight"] = (C,)
            lin(p + "self_attn.q_proj", Hq * D, C, qkv_bias)
            lin(p + "self_attn.k_proj", Hkv * D, C, qkv_bias)
            lin(p + "self_attn.v_proj", Hkv * D, C, qkv_bias)
            lin(p + "self_attn.o_proj", C, Hq * D, o_bias)
            if mt == "qwen3":
                shapes[p + "self_attn.q_norm.weight"] = (D,)
                shapes[p + "self_attn.k_norm.weight"] = (D,)
            shapes[p + "post_attention_layernorm.weight"] = (C,)
            lin(p + "mlp.gate_proj", F, C, mlp_bias)
            lin(p + "mlp.up_proj", F, C, mlp_bias)
            lin(p + "mlp.down_proj", C, F, mlp_bias)
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


def causal_attention(q, k, v, scale, mutations, drop_probs=lambda P: P, window=None):
    """q [B, Hq, T, D]; k, v [B, Hq, T, D] (kv heads already expanded). Returns [B, Hq, T, D].
    window: query i sees keys i - window < j <= i only (None: every j <= i)."""
    T = q.shape[2]
    scores = q.matmul(k.transpose(-1, -2)) * scale
    if "no_causal" not in mutations:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if window is not None and "no_window" not in mutations:
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        w = window + 1 if "window_one_wider" in mutations else window
        scores = scores.masked_fill(j <= i - w, float("-inf"))
    return drop_probs(torch.softmax(scores, dim=-1)).matmul(v)


def rope_inv_freq(cfg, D, mutations):
    """inv_freq [D/2] of the rotary embedding, with linear or llama3 scaling where configured."""
    rs = rope_settings(cfg)
    inv_freq = 1.0 / rs["theta"] ** (torch.arange(0, D, 2, dtype=DTYPE) / D)
    rope_type = rs["type"]
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":  # transformers' _compute_linear_scaling_rope_parameters
        return inv_freq if "rope_no_linear" in mutations else inv_freq / rs["factor"]
    if rope_type != "llama3":
        raise ValueError("unsupported rope type %r" % rope_type)
    if "rope_no_llama3" in mutations:
        return inv_freq
    # transformers' _compute_llama3_parameters.
    factor = rs["factor"]
    low = rs["low_freq_factor"]
    high = rs["high_freq_factor"]
    original = rs["original_max_position_embeddings"]
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


def embed_tokens(cfg, W, input_ids, mutations):
    """nn.Embedding(padding_idx=pad_token_id): the pad row's value is used, but input tokens send
    it no gradient (it still gets one as a row of a tied head)."""
    x = W[input_ids]
    pad = padding_idx(cfg)
    if pad is None or "pad_row_input_grad" in mutations:
        return x
    return torch.where((input_ids == pad)[..., None], W.detach()[input_ids], x)


# ----------------------------------------------------------------------------------------------
# Models


def llama_forward(cfg, P, input_ids, head, mutations=frozenset(), drop=NoDropout()):
    """Llama, Qwen2, Qwen3 and Mistral (the same block; Qwen2 with q/k/v biases, Qwen3 with q/k
    norms per head, Mistral with a sliding window)."""
    C, Hq, Hkv, D = _llama_dims(cfg)
    qk_norm = cfg["model_type"] == "qwen3"
    window = sliding_window(cfg)
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

    def g(name):
        if "qwen2_no_qkv_bias" in mutations and cfg["model_type"] == "qwen2" and name.endswith("_proj.bias"):
            return None
        if "attn_bias_not_on_o" in mutations and name.endswith("o_proj.bias"):
            return None
        return P.get(name)

    act = torch.nn.functional.gelu if "silu_to_gelu" in mutations else torch.nn.functional.silu
    x = embed_tokens(cfg, P["model.embed_tokens.weight"], input_ids, mutations)  # [B, T, C]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        a = p + "self_attn."
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps, mutations)
        q = linear(h, P[a + "q_proj.weight"], g(a + "q_proj.bias")).view(B, T, Hq, D)
        k = linear(h, P[a + "k_proj.weight"], g(a + "k_proj.bias")).view(B, T, Hkv, D)
        v = linear(h, P[a + "v_proj.weight"], g(a + "v_proj.bias")).view(B, T, Hkv, D).transpose(1, 2)
        # Qwen3Attention: q_norm(q_proj(x).view(.., heads, head_dim)), the same for k, then RoPE.
        kw = a + ("q_norm.weight" if "qk_norm_shared" in mutations else "k_norm.weight")
        if qk_norm and "qk_norm_after_rope" not in mutations:
            q = rms_norm(q, P[a + "q_norm.weight"], eps, mutations)
            k = rms_norm(k, P[kw], eps, mutations)
        q = apply_rope(q.transpose(1, 2), cos, sin, mutations)
        k = apply_rope(k.transpose(1, 2), cos, sin, mutations)
        if qk_norm and "qk_norm_after_rope" in mutations:
            q = rms_norm(q, P[a + "q_norm.weight"], eps, mutations)
            k = rms_norm(k, P[kw], eps, mutations)
        k = k[:, kv_of_head]  # [B, Hq, T, D]
        v = v[:, kv_of_head]
        o = causal_attention(q, k, v, 1.0 / math.sqrt(D), mutations, lambda A, i=i: drop.probs(A, i), window)
        o = o.transpose(1, 2).reshape(B, T, Hq * D)
        x = x + linear(o, P[a + "o_proj.weight"], g(a + "o_proj.bias"))
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps, mutations)
        m = p + "mlp."
        u = act(linear(h, P[m + "gate_proj.weight"], g(m + "gate_proj.bias"))) * linear(
            h, P[m + "up_proj.weight"], g(m + "up_proj.bias"))
        x = x + linear(u, P[m + "down_proj.weight"], g(m + "down_proj.bias"))
    x = rms_norm(x, P["model.norm.weight"], eps, mutations)
    return linear(x, head)


def opt_forward(cfg, P, input_ids, head, mutations=frozenset(), drop=NoDropout()):
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
    x = embed_tokens(cfg, P[d + "embed_tokens.weight"], input_ids, mutations)
    x = x + P[d + "embed_positions.weight"][positions][None]
    for i in range(L):
        p = d + "layers.%d." % i
        h = ln(x, p + "self_attn_layer_norm")
        a = p + "self_attn."
        q = linear(h, P[a + "q_proj.weight"], g(a + "q_proj.bias")) * D ** -0.5
        k = linear(h, P[a + "k_proj.weight"], g(a + "k_proj.bias"))
        v = linear(h, P[a + "v_proj.weight"], g(a + "v_proj.bias"))
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        o = causal_attention(q, k, v, 1.0, mutations, lambda A, i=i: drop.probs(A, i)).transpose(1, 2).reshape(B, T, C)
        x = x + drop.residual(linear(o, P[a + "out_proj.weight"], g(a + "out_proj.bias")), i, SITE_ATTN_OUT)
        h = ln(x, p + "final_layer_norm")
        h = torch.relu(linear(h, P[p + "fc1.weight"], g(p + "fc1.bias")))
        x = x + drop.residual(linear(h, P[p + "fc2.weight"], g(p + "fc2.bias")), i, SITE_MLP_OUT)
    x = ln(x, d + "final_layer_norm")
    return linear(x, head)


def run_reference(cfg, params, input_ids, labels, mutations=frozenset(), extras=None, training=None):
    """Forward and backward in float64 (a training pass with dropout when `training` is
    {"seed", "sample_base"}, as load_dump reads them).

    cfg: the Hugging Face config dict; params: {HF name: numpy array}, exactly the names of
    expected_params(cfg); input_ids, labels: integer arrays [B, T].
    Returns (logits numpy [B, T, V], loss float, {HF name: gradient numpy array}). A dict passed
    as `extras` receives "head_grad": with a tied head its share of the embedding's gradient, else None.
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
    embed = "model.embed_tokens.weight" if cfg["model_type"] in LLAMA_LIKE else "model.decoder.embed_tokens.weight"
    # A tied head reads the embedding through its own leaf, so that its share of the gradient can be
    # told apart (and, unless a mutation detaches it, added to the embedding's).
    tied = "lm_head.weight" not in P
    head = P[embed].detach().clone().requires_grad_(True) if tied else P["lm_head.weight"]
    forward = llama_forward if cfg["model_type"] in LLAMA_LIKE else opt_forward
    logits = forward(cfg, P, ids, head, mutations, dropout_of(cfg, training, mutations))
    loss = cross_entropy_mean(logits, lab, mutations)
    loss.backward()
    grads = {}
    for n, t in P.items():  # a parameter the loss does not reach has a zero gradient
        grads[n] = t.grad.detach().numpy().copy() if t.grad is not None else np.zeros(t.shape)
    head_grad = head.grad.detach().numpy().copy() if tied else None
    if extras is not None:
        extras["head_grad"] = head_grad
    if tied and "tied_head_detached" not in mutations:
        grads[embed] = grads[embed] + head_grad
    return logits.detach().numpy(), float(loss.item()), grads


def eval_loss_sum(cfg, params, input_ids, labels, rows_per_pass=8):
    """Forward only, in float64, over a batch of windows or examples of any size (run a few rows at a
    time): (summed cross-entropy of the positions whose label is not -1, how many there are). The
    labels are the next tokens (no shift), -1 where nothing counts (masked or padded positions): an
    evaluation's loss is the sum over all rows divided by the count."""
    want = expected_params(cfg)
    if set(want) != set(params):
        raise ValueError("parameter names differ from the architecture: %s"
                         % sorted(set(want) ^ set(params))[:5])
    P = {n: torch.tensor(np.asarray(params[n], dtype=np.float64), dtype=DTYPE) for n in want}
    embed = "model.embed_tokens.weight" if cfg["model_type"] in LLAMA_LIKE else "model.decoder.embed_tokens.weight"
    head = P.get("lm_head.weight", P[embed])
    forward = llama_forward if cfg["model_type"] in LLAMA_LIKE else opt_forward
    ids_all = np.asarray(input_ids, dtype=np.int64)
    lab_all = np.asarray(labels, dtype=np.int64)
    total, count = 0.0, 0
    with torch.no_grad():
        for r0 in range(0, ids_all.shape[0], rows_per_pass):
            ids = torch.as_tensor(ids_all[r0:r0 + rows_per_pass])
            lab = torch.as_tensor(lab_all[r0:r0 + rows_per_pass]).reshape(-1)
            logits = forward(cfg, P, ids, head)
            flat = logits.reshape(-1, logits.shape[-1])
            keep = lab != IGNORE_INDEX
            logp = torch.log_softmax(flat[keep], dim=-1)
            total += float(-logp.gather(1, lab[keep].unsqueeze(1)).sum())
            count += int(keep.sum())
    return total, count


def reference_from_dump(dump, mutations=frozenset(), extras=None):
    """run_reference on the weights and batch of a load_dump() result."""
    return run_reference(dump["config"], dump["params"], dump["input_ids"], dump["labels"], mutations, extras,
                         dump.get("training"))
