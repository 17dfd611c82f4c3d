#!/usr/bin/python3
"""Checks fsdp.c's forward and backward against an independent float64 PyTorch reference.

For each case it runs tests/tools/oracle_dump (one fp32 forward+backward on the CPU backend) and
compares the dumped logits, loss and every parameter gradient with tests/oracle/reference.py,
requiring ||fsdp - ref|| / ||ref|| <= 1e-4 for each. It also checks that the dumped parameter and
gradient names are exactly the parameters of the architecture, that the model config the tool
reports is the one the case asked for, that the padding_idx row got no gradient from the pad tokens
in the inputs (exactly 0 untied; exactly the head's share tied), and (unless --no-mutations) that
the comparison is sensitive: every deliberate bug in reference.MUTATIONS must make some comparison
fail. The "+dropout" cases are training passes: fsdp.c's masks against the reference's own Philox
(checked first against Random123's known answers), as transformers applies each family's rates.

Environment: FSDP_TOOLS_DIR (where oracle_dump is; default <repo>/build/tests), FSDP_TEST_TMP
(where the dumps go; default a temporary directory). Exit status 0 on pass, 1 on failure.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

TOL = 1e-4
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import numpy as np
except ImportError as e:
    print("oracle_torch: FAIL: cannot import numpy (%s): install the Debian package python3-numpy" % e)
    sys.exit(1)
try:
    import torch  # noqa: F401
except ImportError as e:
    print("oracle_torch: FAIL: cannot import torch (%s): install the Debian package python3-torch "
          "(apt-get install python3-torch) and run this test with /usr/bin/python3" % e)
    sys.exit(1)
try:
    import h5py  # noqa: F401
except ImportError as e:
    print("oracle_torch: FAIL: cannot import h5py (%s): install the Debian package python3-h5py "
          "(apt-get install python3-h5py) and run this test with /usr/bin/python3" % e)
    sys.exit(1)

sys.path.insert(0, os.path.join(REPO, "tests", "oracle"))
import reference  # noqa: E402

DATA = os.path.join(REPO, "tests", "data")

# What the presets must be (the shapes tests/oracle/README.md documents); a config file case expects
# what its own file says. Configs are compared by what they mean to the reference (semantics()), so
# that a transformers 5 file (rope_parameters) matches the transformers 4 spelling fsdp.c writes.
TINY_LLAMA = {
    "model_type": "llama", "vocab_size": 1031, "hidden_size": 48, "intermediate_size": 88,
    "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 100.0, "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32},
}
TINY_OPT = {
    "model_type": "opt", "vocab_size": 1031, "hidden_size": 40, "ffn_dim": 72, "num_hidden_layers": 2,
    "num_attention_heads": 5, "max_position_embeddings": 128, "tie_word_embeddings": True,
    "do_layer_norm_before": True, "enable_bias": True, "pad_token_id": 1,
}
TINY_QWEN3 = {
    "model_type": "qwen3", "vocab_size": 1019, "hidden_size": 40, "intermediate_size": 72,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000.0, "tie_word_embeddings": False,
    "attention_bias": False, "pad_token_id": None,
}
TINY_MISTRAL = {
    "model_type": "mistral", "vocab_size": 1021, "hidden_size": 48, "intermediate_size": 80,
    "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "sliding_window": 5, "pad_token_id": None,
}
TINY_QWEN2 = {
    "model_type": "qwen2", "vocab_size": 1013, "hidden_size": 40, "intermediate_size": 76,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 1000.0, "tie_word_embeddings": False, "pad_token_id": None,
}


def semantics(cfg):
    """What a config means to the reference: parameter shapes, norm epsilon, RoPE, padding_idx."""
    out = {"model_type": cfg["model_type"], "params": reference.expected_params(cfg),
           "padding_idx": reference.padding_idx(cfg)}
    if cfg["model_type"] in reference.LLAMA_LIKE:
        out["rms_norm_eps"] = float(cfg.get("rms_norm_eps", 1e-6))
        out["rope"] = reference.rope_settings(cfg)
        out["sliding_window"] = reference.sliding_window(cfg)
    return out


def file_expect(path):
    with open(path) as f:
        return json.load(f)


DATA_CONFIG = lambda name: os.path.join(DATA, name, "config.json")  # noqa: E731
UNTIED = DATA_CONFIG("tiny-llama-untied")
# (name, MODEL argument, seed, batch, seq, attention, expected config: a dict, or None for the file's,
#  and for training passes (dropout, attention_dropout, global index of the first sample))
CASES = [
    ("tiny-llama/flash", "tiny-llama", 11, 2, 13, "flash", TINY_LLAMA),
    ("tiny-llama/eager", "tiny-llama", 12, 2, 17, "eager", TINY_LLAMA),
    ("tiny-llama-untied/flash", os.path.dirname(UNTIED), 13, 2, 15, "flash", None),
    ("tiny-llama-untied/eager", UNTIED, 14, 2, 14, "eager", None),
    ("tiny-opt/flash", "tiny-opt", 15, 2, 15, "flash", TINY_OPT),
    ("tiny-opt/eager", "tiny-opt", 16, 2, 13, "eager", TINY_OPT),
    ("tiny-opt-nobias/flash", DATA_CONFIG("tiny-opt-nobias"), 17, 2, 14, "flash", None),
    ("tiny-qwen2/flash", "tiny-qwen2", 18, 2, 15, "flash", TINY_QWEN2),
    ("tiny-qwen2/eager", "tiny-qwen2", 19, 2, 12, "eager", TINY_QWEN2),
    ("tiny-qwen2-tied/eager", DATA_CONFIG("tiny-qwen2-tied"), 20, 2, 16, "eager", None),
    # Dropout: OPT drops the attention and MLP outputs and the probabilities; Llama and Qwen2 only the
    # probabilities (the `dropout` given to tiny-llama must have no effect). Sequences past 16 cross
    # the 16 x 16 tiles of the probability masks; a sample index past 2^32 uses the counter's high bits.
    ("tiny-opt/flash+dropout", "tiny-opt", 21, 2, 15, "flash", TINY_OPT, (0.1, 0.1, 1000)),
    ("tiny-opt/eager+dropout", "tiny-opt", 22, 3, 21, "eager", TINY_OPT, (0.25, 0.2, 123456789012)),
    ("tiny-llama/flash+dropout", "tiny-llama", 23, 2, 17, "flash", TINY_LLAMA, (0.3, 0.1, 77)),
    ("tiny-llama/eager+dropout", "tiny-llama", 24, 2, 33, "eager", TINY_LLAMA, (0.0, 0.15, 5)),
    ("tiny-qwen2/flash+dropout", "tiny-qwen2", 25, 2, 18, "flash", TINY_QWEN2, (0.0, 0.1, 31)),
    # Qwen3's per-head q/k norms (head_dim 12, not hidden / heads = 10) and Mistral's window of 5
    # keys, shorter than every sequence here (so most queries lose keys to it).
    ("tiny-qwen3/flash", "tiny-qwen3", 26, 2, 15, "flash", TINY_QWEN3),
    ("tiny-qwen3/eager", "tiny-qwen3", 27, 2, 13, "eager", TINY_QWEN3),
    ("tiny-qwen3/flash+dropout", "tiny-qwen3", 28, 2, 17, "flash", TINY_QWEN3, (0.0, 0.1, 9)),
    ("tiny-mistral/flash", "tiny-mistral", 29, 2, 17, "flash", TINY_MISTRAL),
    ("tiny-mistral/eager", "tiny-mistral", 30, 2, 14, "eager", TINY_MISTRAL),
    ("tiny-mistral/eager+dropout", "tiny-mistral", 31, 2, 19, "eager", TINY_MISTRAL, (0.0, 0.2, 4242)),
]
CASES = [c if len(c) == 8 else c + (None,) for c in CASES]


def rel(a, b, denom=None):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    d = np.linalg.norm(b) if denom is None else denom
    num = np.linalg.norm(a - b)
    if d == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return float(num / d)


def same_value(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=0.0)
    return a == b


def grad_denominators(ref_grads):
    """||ref grad|| of each tensor, except where the reference gradient is zero in exact arithmetic.

    k_proj.bias is such a tensor: adding a constant vector to every key adds the same amount to
    every score of a query row, which softmax ignores, so its true gradient is 0 and fsdp.c's fp32
    value is pure rounding. Those tensors are measured against the gradient of their layer's
    weight (or of the whole model), so that rounding passes and a real error does not.
    """
    total = math.sqrt(sum(float(np.sum(np.asarray(g, dtype=np.float64) ** 2)) for g in ref_grads.values()))
    out = {}
    for name, g in ref_grads.items():
        n = float(np.linalg.norm(g))
        if n > 1e-9 * total:
            out[name] = (n, None)
            continue
        sibling = name[: -len(".bias")] + ".weight" if name.endswith(".bias") else None
        if sibling in ref_grads and np.linalg.norm(ref_grads[sibling]) > 1e-9 * total:
            out[name] = (float(np.linalg.norm(ref_grads[sibling])), sibling)
        else:
            out[name] = (total, "all parameters")
    return out


def compare(dump, ref, verbose, label):
    """Returns (ok, worst relative error, name of the worst comparison, lines)."""
    logits, loss, grads = ref
    lines = []
    results = []

    def check(what, err, note=""):
        ok = err <= TOL
        results.append((err, what, ok))
        lines.append("  %-62s rel err %.3e%s%s" % (what, err, note, "" if ok else "   FAIL (> %.0e)" % TOL))

    if dump["logits"].shape != logits.shape:
        lines.append("  logits: shape %s, reference %s   FAIL" % (dump["logits"].shape, logits.shape))
        results.append((math.inf, "logits shape", False))
    else:
        check("logits", rel(dump["logits"], logits))
    check("loss (fsdp %.7f, ref %.7f)" % (dump["loss"], loss), abs(dump["loss"] - loss) / abs(loss))
    denoms = grad_denominators(grads)
    for name in sorted(grads):
        if name not in dump["grads"]:
            lines.append("  grad/%s: missing   FAIL" % name)
            results.append((math.inf, "grad/" + name, False))
            continue
        a = dump["grads"][name]
        if a.shape != grads[name].shape:
            lines.append("  grad/%s: shape %s, parameter %s   FAIL" % (name, a.shape, grads[name].shape))
            results.append((math.inf, "grad/" + name, False))
            continue
        d, basis = denoms[name]
        note = "" if basis is None else "  (reference is 0; relative to ||grad %s||)" % basis
        check("grad/" + name, rel(a, grads[name], d), note)
    ok = all(r[2] for r in results)
    worst = max(results, key=lambda r: r[0])
    if verbose:
        for line in lines:
            print(line)
    return ok, worst[0], worst[1]


def check_padding(dump, head_grad):
    """The padding_idx row gets nothing from the pad tokens in the inputs: its gradient is exactly 0
    untied, and exactly the head's share tied. Returns a list of failure messages."""
    cfg = dump["config"]
    pad = reference.padding_idx(cfg)
    if pad is None:
        return []
    if not (dump["input_ids"] == pad).any():
        return ["the inputs hold no padding token %d" % pad]
    embed = "model.embed_tokens.weight" if cfg["model_type"] in reference.LLAMA_LIKE \
        else "model.decoder.embed_tokens.weight"
    row = np.asarray(dump["grads"][embed][pad], dtype=np.float64)
    if head_grad is None:
        ok = not row.any()
        print("  %s: padding row %d gradient is exactly 0 (untied head)%s"
              % ("ok" if ok else "FAIL", pad, "" if ok else ", got norm %.3e" % np.linalg.norm(row)))
        return [] if ok else ["padding row %d has a gradient from the inputs" % pad]
    err = rel(row, head_grad[pad])
    ok = err <= TOL and row.any()
    print("  %s: padding row %d gradient is the head's share, rel err %.3e" % ("ok" if ok else "FAIL", pad, err))
    return [] if ok else ["padding row %d gradient is not the head's share (rel err %.3e)" % (pad, err)]


def run_dump(tool, case, tmp):
    name, model, seed, B, T, attn, _, drop = case
    out = os.path.join(tmp, "oracle_%s.h5" % name.replace("/", "_"))
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
    cmd = [tool, model, str(seed), str(B), str(T), out, attn] + ([str(x) for x in drop] if drop else [])
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    if p.returncode != 0:
        raise RuntimeError("%s exited with %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return out


def check_structure(case, dump):
    """Names, shapes and config of a dump. Returns a list of failure messages."""
    name, model, _, B, T, _, expect, drop = case
    cfg = dump["config"]
    errors = []
    if expect is None:
        expect = file_expect(model if model.endswith(".json") else os.path.join(model, "config.json"))
    try:
        got, want = semantics(cfg), semantics(expect)
        want_shapes = got["params"]
    except (KeyError, ValueError) as e:
        return errors + ["the reference cannot model this config: %s" % e]
    for key in sorted(set(got) | set(want)):
        if not same_value(got.get(key), want.get(key)):
            errors.append("config means %s = %r, the case asks for %r" % (key, got.get(key), want.get(key)))
    params, grads = set(dump["params"]), set(dump["grads"])
    if params != grads:
        errors.append("gradient names differ from parameter names: only params %s, only grads %s"
                      % (sorted(params - grads), sorted(grads - params)))
    missing, extra = sorted(set(want_shapes) - params), sorted(params - set(want_shapes))
    if missing:
        errors.append("parameters the architecture has but the dump lacks: %s" % missing)
    if extra:
        errors.append("parameters in the dump that the architecture does not have: %s" % extra)
    for n in sorted(set(want_shapes) & params):
        if tuple(dump["params"][n].shape) != tuple(want_shapes[n]):
            errors.append("param/%s has shape %s, expected %s" % (n, dump["params"][n].shape, want_shapes[n]))
    V = cfg.get("vocab_size")
    if dump["input_ids"].shape != (B, T) or dump["labels"].shape != (B, T):
        errors.append("input_ids/labels shapes %s/%s, expected %s"
                      % (dump["input_ids"].shape, dump["labels"].shape, (B, T)))
    elif dump["input_ids"].min() < 0 or dump["input_ids"].max() >= V:
        errors.append("input_ids out of range")
    elif not ((dump["labels"] == -1) | ((dump["labels"] >= 0) & (dump["labels"] < V))).all():
        errors.append("labels out of range")
    elif (dump["labels"] != -1).sum() == 0:
        errors.append("no counted labels")
    training = dump["training"]
    if bool(training) != bool(drop) or (drop and training["sample_base"] != drop[2]):
        errors.append("the dump says training %s, the case asks for dropout %s" % (training, drop))
    return errors


def applies(mutation, dump):
    cfg = dump["config"]
    if mutation.startswith("dropout_"):
        drop = reference.dropout_of(cfg, dump["training"], frozenset())
        hidden = getattr(drop, "p", {}).get("hidden", 0.0) > 0.0
        attention = getattr(drop, "p", {}).get("attention", 0.0) > 0.0
        if mutation == "dropout_sites_swapped":
            return hidden
        return attention if mutation == "dropout_probs_transposed" else hidden or attention
    llama = cfg["model_type"] in reference.LLAMA_LIKE
    tied = cfg.get("tie_word_embeddings", reference.TIE_DEFAULT[cfg["model_type"]])
    if mutation == "rope_no_llama3":
        rs = cfg.get("rope_scaling") or {}
        return llama and rs.get("rope_type", rs.get("type")) == "llama3"
    if mutation in ("rope_interleaved", "gqa_modulo", "rms_eps_outside", "silu_to_gelu"):
        if mutation == "gqa_modulo":
            hq, hkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
            return llama and hkv not in (1, hq)
        return llama
    if mutation in ("opt_no_offset", "ln_unbiased_var"):
        return not llama
    if mutation == "tied_head_detached":
        return tied
    if mutation == "qwen2_no_qkv_bias":
        return cfg["model_type"] == "qwen2"
    if mutation == "attn_bias_not_on_o":
        return cfg["model_type"] == "llama" and reference.biases(cfg)[1]
    if mutation == "pad_row_input_grad":
        return reference.padding_idx(cfg) is not None
    if mutation in ("qk_norm_after_rope", "qk_norm_shared"):
        return cfg["model_type"] == "qwen3"
    if mutation in ("no_window", "window_one_wider"):
        w = reference.sliding_window(cfg)
        return w is not None and w < dump["input_ids"].shape[1]
    if mutation == "rope_no_linear":
        return llama and reference.rope_settings(cfg)["type"] == "linear"
    return True


def main(argv):
    verbose = "-q" not in argv
    mutations = "--no-mutations" not in argv
    tool = os.path.join(os.environ.get("FSDP_TOOLS_DIR", os.path.join(REPO, "build", "tests")), "oracle_dump")
    if not os.access(tool, os.X_OK):
        print("oracle_torch: FAIL: %s is not built (ninja -C build, or set FSDP_TOOLS_DIR)" % tool)
        return 1
    print("oracle_torch: torch %s, h5py %s, tolerance %.0e, tool %s"
          % (torch.__version__, h5py.__version__, TOL, tool))
    kat = reference.philox_known_answers()
    print("philox4x32-10 of the reference against Random123's known answers: %s" % ("ok" if not kat else "FAIL"))
    for line in kat:
        print("  FAIL: " + line)
    tmp_root = os.environ.get("FSDP_TEST_TMP")
    if tmp_root:
        os.makedirs(tmp_root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="oracle_torch.", dir=tmp_root or None)

    failed = ["philox known answers"] if kat else []
    dumps = []
    for case in CASES:
        name = case[0]
        print("case %s (%s, seed %d, batch %d, seq %d, %s%s)" % (name, os.path.relpath(case[1], REPO)
              if os.path.sep in case[1] else case[1], case[2], case[3], case[4], case[5],
              ", training: dropout %g, attention_dropout %g, samples from %d" % case[7] if case[7] else ""))
        try:
            dump = reference.load_dump(run_dump(tool, case, tmp))
        except (RuntimeError, OSError) as e:
            print("  FAIL: %s" % e)
            failed.append(name)
            continue
        errors = check_structure(case, dump)
        for e in errors:
            print("  FAIL: %s" % e)
        if errors:
            failed.append(name)
            continue
        extras = {}
        ok, worst, what = compare(dump, reference.reference_from_dump(dump, extras=extras), verbose, name)
        print("  %s: worst rel err %.3e (%s)" % ("ok" if ok else "FAIL", worst, what))
        pad_errors = check_padding(dump, extras["head_grad"])
        for e in pad_errors:
            print("  FAIL: %s" % e)
        if not ok or pad_errors:
            failed.append(name)
        dumps.append((name, dump))

    if mutations and dumps:
        # Each deliberate bug in the reference must make at least one applicable case fail; else the
        # oracle has gone blind to it (for instance because the dumped weights became degenerate).
        print("sensitivity: each deliberate bug in the reference must be detected")
        for mut, what in sorted(reference.MUTATIONS.items()):
            hits = []
            for name, dump in dumps:
                if not applies(mut, dump):
                    continue
                ok, worst, where = compare(dump, reference.reference_from_dump(dump, {mut}), False, name)
                hits.append((name, ok, worst, where))
            if not hits:
                print("  mutation %-20s no case applies   FAIL" % mut)
                failed.append("mutation " + mut)
                continue
            undetected = [h[0] for h in hits if h[1]]
            best = max(hits, key=lambda h: h[2])
            print("  mutation %-20s %s in %d/%d cases, largest rel err %.2e (%s, %s)%s"
                  % (mut, "detected", len(hits) - len(undetected), len(hits), best[2], best[0], best[3],
                     "" if not undetected else "; not in " + ", ".join(undetected)))
            if len(undetected) == len(hits):
                print("    FAIL: %s went unnoticed" % what)
                failed.append("mutation " + mut)

    if failed:
        print("oracle_torch: FAIL (%s); dumps kept in %s" % (", ".join(failed), tmp))
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("oracle_torch: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
