"""Dropout masks for the oracle (tests/oracle/reference.py), written from the definitions alone.

Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011) from the paper's constants, checked against Random123's known answers, and fsdp.c's
documented counter layout (docs/DESIGN.md, "Dropout masks"; src/kernels/dropout.h): key = seed;
counter = (group bits 0..31, group bits 32..47 | site << 16, sample bits 0..31, sample bits 32..47 |
layer << 16); an element is kept when its word is >= round(p * 2^32). Shares no code with fsdp.c.

The mutation names (reference.MUTATIONS) that start with "dropout_" are planted here.
"""
import math

import numpy as np
import torch

DTYPE = torch.float64

PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # Weyl sequence added to the key after every round
U32 = np.uint64(0xFFFFFFFF)
SITE_PROBS, SITE_ATTN_OUT, SITE_MLP_OUT = 0, 1, 2


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """The four output words for counters (c0..c3, arrays of equal shape) and key (k0, k1)."""
    c = [np.asarray(x, dtype=np.uint64) & U32 for x in (c0, c1, c2, c3)]
    k = [np.uint64(k0) & U32, np.uint64(k1) & U32]
    for _ in range(10):
        p0 = np.uint64(PHILOX_M[0]) * c[0]  # 32 x 32 bits: exact in 64
        p1 = np.uint64(PHILOX_M[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k[0], p1 & U32, (p0 >> np.uint64(32)) ^ c[3] ^ k[1], p0 & U32]
        k = [(k[0] + np.uint64(PHILOX_W[0])) & U32, (k[1] + np.uint64(PHILOX_W[1])) & U32]
    return c


def philox_known_answers():
    """Random123's kat_vectors for philox4x32_10: a list of failures (empty when all match)."""
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    bad = []
    for ctr, key, want in kat:
        got = tuple(int(w) for w in philox4x32_10(*ctr, *key))
        if got != want:
            bad.append("counter %s key %s: %s, expected %s" % (ctr, key, [hex(x) for x in got], [hex(x) for x in want]))
    return bad


class Dropout:
    """The masks of one training micro-batch: seed, the global index of its first sample, and the
    rates (float32, as stored); all elements kept when not training."""

    def __init__(self, seed, sample_base, hidden, attention, mutations):
        self.seed, self.base, self.mutations = int(seed), int(sample_base), mutations
        if "dropout_other_sample" in mutations:
            self.base += 1
        self.p = {"hidden": float(np.float32(hidden)), "attention": float(np.float32(attention))}

    def _keep(self, p, groups, words, samples, layer, site):
        threshold = min(int(math.floor(p * 4294967296.0 + 0.5)), 0xFFFFFFFF)  # round(p * 2^32)
        g = groups.astype(np.uint64)
        s = samples.astype(np.uint64)
        w = philox4x32_10(g & U32, (g >> np.uint64(32)) | np.uint64(site << 16), s & U32,
                          (s >> np.uint64(32)) | np.uint64(layer << 16), self.seed & 0xFFFFFFFF, self.seed >> 32)
        word = np.choose(words, w)
        return torch.tensor((word >= threshold).astype(np.float64), dtype=DTYPE)

    def _apply(self, x, keep, p):
        y = x * keep * (1.0 if "dropout_no_scale" in self.mutations else 1.0 / (1.0 - p))
        return x + (y - x).detach() if "dropout_not_in_backward" in self.mutations else y

    def residual(self, x, layer, site):
        """x [B, T, C] (an attention or MLP output of `layer`), dropped as transformers' `dropout`."""
        p = self.p["hidden"]
        if p == 0.0:
            return x
        if "dropout_sites_swapped" in self.mutations:
            site = SITE_MLP_OUT if site == SITE_ATTN_OUT else SITE_ATTN_OUT
        B, T, C = x.shape
        e = (np.arange(T)[:, None] * C + np.arange(C)[None, :])[None].repeat(B, 0)  # position in the sample
        samples = self.base + np.arange(B)[:, None, None] + np.zeros_like(e)
        return self._apply(x, self._keep(p, e >> 2, e & 3, samples, layer, site), p)

    def probs(self, P, layer):
        """P [B, H, T, T] (query, key) softmax probabilities of `layer`, dropped as `attention_dropout`."""
        p = self.p["attention"]
        if p == 0.0:
            return P
        B, H, T, _ = P.shape
        tiles = (T + 15) // 16
        i = np.arange(T)[:, None].repeat(T, 1)
        j = np.arange(T)[None, :].repeat(T, 0)
        if "dropout_probs_transposed" in self.mutations:
            i, j = j, i
        h = np.arange(H)[:, None, None]
        # Groups are the four elements (i, j), (i, j+8), (i+8, j), (i+8, j+8) of a 16 x 16 tile.
        groups = ((h * tiles + i // 16) * tiles + j // 16) * 64 + (i % 8) * 8 + j % 8  # [H, T, T]
        words = 2 * ((i // 8) % 2) + (j // 8) % 2
        groups = groups[None].repeat(B, 0)
        words = np.broadcast_to(words, groups.shape)
        samples = self.base + np.arange(B)[:, None, None, None] + np.zeros_like(groups)
        return self._apply(P, self._keep(p, groups, words, samples, layer, SITE_PROBS), p)


class NoDropout:
    def residual(self, x, layer, site):
        return x

    def probs(self, P, layer):
        return P


def dropout_of(cfg, training, mutations):
    """The dropout transformers applies for cfg: OPT reads `dropout` (default 0.1) and
    `attention_dropout` (0.0); Llama and Qwen2 only `attention_dropout` (0.0)."""
    if training is None:
        return NoDropout()
    hidden = cfg.get("dropout", 0.1) if cfg["model_type"] == "opt" else 0.0
    return Dropout(training["seed"], training["sample_base"], hidden, cfg.get("attention_dropout", 0.0), mutations)
