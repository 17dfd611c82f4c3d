"""`fsdp generate` end to end on the CPU backend.

Models: tiny Llama (GQA, llama3 rope, tied, the Llama 2 tokenizer's 32,000 ids), tiny OPT (learned
positions, biases, tied, GPT-2's byte-level ids), tiny Qwen2 (q/k/v biases, untied), the untied Llama
of tests/data with every bias, tiny Qwen3 (per-head q/k norms) and tiny Mistral (a sliding window of 5
keys, which generation runs far past), each with initializer_range 1 (transformers' 0.02 makes a random model
repeat one token, which would test little), trained 3 steps so that biases and norms move off 0 and 1,
and exported with `fsdp export --dtype fp32`.

- Greedy (24 new tokens) from the export (--init-from DIR), from the checkpoint (--checkpoint DIR and
  --init-from FILE) and with --do-sample no equals the greedy continuation that the independent float64
  PyTorch oracle (tests/oracle/reference.py) computes by running the whole growing sequence and taking
  the argmax; the smallest top-1/top-2 margin of the oracle is printed. A deliberate bug planted in the
  oracle (no llama3 rope scaling, no OPT position offset, no Qwen2 q/k/v biases, Qwen3's q/k norms
  after rotary, Mistral without its window) changes its continuation: the comparison is sensitive to them.
- Text: the prompt is encoded as `fsdp tokenize` encodes it (BOS by default, none with --no-special),
  the tokenizer.json beside the model is found without --tokenizer, and the streamed text is the
  decode of prompt + continuation less the decode of the prompt, for the Llama 2 (SentencePiece) and a
  GPT-2 (byte-level) tokenizer; the stream itself (tests/tools/stream_check) on real text with the
  real Llama 3 and Llama 2 files: pieces concatenate to the text, and no piece holds U+FFFD where the
  text has none (multi-byte characters split over tokens are held back).
- Sampling: the same seed gives the same tokens, another seed others; top-k 1, a tiny top-p, a tiny
  temperature and --do-sample no give the greedy tokens; generation_config.json's do_sample,
  temperature and top_k become the defaults.
- --max-new-tokens 0; EOS from generation_config.json (a list) and, without it, config.json's list
  stops generation right after that token.
- Bad inputs, one line each: no tokenizer, a missing one, one larger than the model's vocabulary, a
  prompt longer than OPT's positions, prompt + new tokens past them, ids outside the vocabulary,
  missing and truncated checkpoints, a directory without weights, a truncated safetensors file, a
  malformed generation_config.json, conflicting flags, --top-p 0, two MPI ranks.
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
import fsdptest as t
import tokfixtures as tf

import numpy as np
import torch

import reference
import safetensors_np as st

D = t.tmpdir("generate")
FX = tf.fixtures()
LLAMA2 = os.path.join(FX, "llama2", "tokenizer.json")
LLAMA3 = os.path.join(FX, "llama3", "tokenizer.json")
GPT2 = tf.gpt2_tokenizer(os.path.join(D, "gpt2-tokenizer.json"))
NEW = 24


def fsdp(args, check=True, nprocs=1):
    return t.run(nprocs, args, check=check)


def config_of(preset_or_dir, **changes):
    """config.json of a preset (through fsdp export) or of a tests/data folder, with changes."""
    src = os.path.join(t.ROOT, "tests", "data", preset_or_dir, "config.json")
    if not os.path.exists(src):
        out = os.path.join(D, "preset-" + preset_or_dir)
        fsdp(["export", "--model", preset_or_dir, "--out", out, "--force"])
        src = os.path.join(out, "config.json")
    cfg = json.load(open(src))
    cfg.update(changes)
    return cfg


def make_model(name, cfg):
    """Trains the config 3 steps (fp32) and exports it: (export dir, checkpoint dir)."""
    path = os.path.join(D, name + ".json")
    json.dump(cfg, open(path, "w"), indent=1)
    ck, out = os.path.join(D, name + "-ck"), os.path.join(D, name)
    fsdp(["train", "--model", path, "--steps", "3", "--lr", "0.05", "--seq", "32", "--mbs", "2", "--data", "synthetic",
          "--synthetic-vocab", str(min(1000, cfg["vocab_size"])), "--model-precision", "fp32", "--mixed-precision", "no", "--ckpt-dir", ck,
          "--ckpt-every", "3", "--device", "cpu"])
    fsdp(["export", "--checkpoint", ck, "--dtype", "fp32", "--out", out, "--force"])
    return out, ck


def generate(model, args, check=True, source="--init-from"):
    rc, out, err = fsdp(["generate", source, model, "--device", "cpu"] + args, check=check)
    return rc, out, err


def greedy_ids(model, prompt, n=NEW, extra=("--temperature", "0"), source="--init-from"):
    _, out, err = generate(model, ["--prompt-ids", " ".join(map(str, prompt)), "--print-ids", "--max-new-tokens", str(n)]
                           + list(extra), source=source)
    return [int(x) for x in out.split()], err


# ---- the oracle ---------------------------------------------------------------------------------


def load_params(model):
    tensors, _, _, _ = st.read(os.path.join(model, "model.safetensors"))
    return {k: st.to_f32(dt, arr).astype(np.float64) for k, (dt, shape, arr) in tensors.items()}


def oracle_greedy(model, prompt, n=NEW, mutations=frozenset()):
    """Greedy continuation by the float64 reference, the whole sequence run for every new token; and the
    smallest top-1/top-2 margin."""
    cfg = json.load(open(os.path.join(model, "config.json")))
    params = load_params(model)
    want = reference.expected_params(cfg)
    P = {k: torch.tensor(params[k], dtype=torch.float64) for k in want}
    embed = "model.embed_tokens.weight" if cfg["model_type"] in reference.LLAMA_LIKE else "model.decoder.embed_tokens.weight"
    head = P.get("lm_head.weight", P[embed])
    forward = reference.llama_forward if cfg["model_type"] in reference.LLAMA_LIKE else reference.opt_forward
    ids, margin = list(prompt), float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = forward(cfg, P, torch.tensor([ids]), head, frozenset(mutations))[0, -1]
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margin


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- models -------------------------------------------------------------------------------------

MODELS = {
    "llama": config_of("tiny-llama", initializer_range=1.0, vocab_size=32000, bos_token_id=1, eos_token_id=None),
    "opt": config_of("tiny-opt", init_std=1.0, vocab_size=50272, eos_token_id=None),
    "qwen2": config_of("tiny-qwen2", initializer_range=1.0),
    "llama-untied": config_of("tiny-llama-untied", initializer_range=1.0),
    "qwen3": config_of("tiny-qwen3", initializer_range=1.0),
    # a window of 5 keys: the 8-token prompt and the 24 new tokens run far past it
    "mistral": config_of("tiny-mistral", initializer_range=1.0),
}
MUTATION = {"llama": "rope_no_llama3", "opt": "opt_no_offset", "qwen2": "qwen2_no_qkv_bias",
            "llama-untied": "attn_bias_not_on_o", "qwen3": "qk_norm_after_rope", "mistral": "no_window"}
if t.SANITIZED:  # the shared block's every kind (LayerNorm/ReLU/learned positions, q/k norms, windows)
    MODELS = {k: v for k, v in MODELS.items() if k != "llama-untied"}  # its code runs for llama
BUILT = {name: make_model(name, cfg) for name, cfg in MODELS.items()}
PROMPT = [5, 17, 400, 3, 99, 250, 12, 7]

# ---- greedy against the oracle ------------------------------------------------------------------

for name, (model, ck) in BUILT.items():
    got, err = greedy_ids(model, PROMPT)
    ref, margin = oracle_greedy(model, PROMPT)
    at = first_difference(got, ref)
    t.check(at is None, "%s: greedy %d tokens equal the float64 oracle's (smallest oracle top-1/top-2 margin %.3g)%s"
            % (name, NEW, margin, "" if at is None else "; first difference at new token %d: fsdp %s, oracle %s"
               % (at, got[at:at + 4], ref[at:at + 4])))
    t.check(len(set(got)) >= 6, "%s: the continuation is not degenerate (%d distinct tokens)" % (name, len(set(got))))
    t.check("smallest top-1/top-2 logit margin" in err and "tokens/s" in err,
            "%s: the last line reports speeds and the margin: %s" % (name, err.strip().splitlines()[-1][:160]))
    mutated, _ = oracle_greedy(model, PROMPT, mutations={MUTATION[name]})
    t.check(mutated != ref, "%s: the oracle with '%s' continues differently (the comparison is sensitive)"
            % (name, MUTATION[name]))
    if t.SANITIZED and name != "llama":  # the same reader and sampler as for the first model
        continue
    from_ck, _ = greedy_ids(ck, PROMPT, source="--checkpoint")
    from_file, _ = greedy_ids(os.path.join(ck, "step-00000003.h5"), PROMPT)
    no_sample, _ = greedy_ids(model, PROMPT, extra=["--do-sample", "no", "--temperature", "1"])
    t.check(from_ck == got and from_file == got and no_sample == got,
            "%s: --checkpoint DIR, --init-from FILE and --do-sample no give the same tokens" % name)

# ---- text: prompts, the tokenizer beside the model, streaming ------------------------------------

llama, _ = BUILT["llama"]
shutil.copy(LLAMA2, os.path.join(llama, "tokenizer.json"))
TEXT = "The quick brown fox jumps over the lazy dog, and then"


def tokenize(tok, text, special=True):
    args = [t.BIN, "tokenize", "--tokenizer", tok] + ([] if special else ["--no-special"])
    p = subprocess.run(args, input=text + "\n", capture_output=True, text=True, env=t.ENV, check=True)
    return [int(x) for x in p.stdout.split()]


prompt_ids = tokenize(LLAMA2, TEXT)
t.check(prompt_ids[0] == 1, "the Llama 2 tokenizer puts BOS (1) first: %s" % prompt_ids[:4])
_, out, _ = generate(llama, ["--prompt", TEXT, "--temperature", "0", "--print-ids", "--max-new-tokens", "16"])
by_text = [int(x) for x in out.split()]
by_ids, _ = greedy_ids(llama, prompt_ids, 16)
t.check(by_text == by_ids, "--prompt (tokenizer.json found beside the model) generates as --prompt-ids of its "
        "tokenization with BOS")
_, out, _ = generate(llama, ["--prompt", TEXT, "--no-special", "--temperature", "0", "--print-ids", "--max-new-tokens", "16"])
no_bos, _ = greedy_ids(llama, tokenize(LLAMA2, TEXT, special=False), 16)
t.check([int(x) for x in out.split()] == no_bos and no_bos != by_ids, "--no-special encodes without BOS")


def check_stream(model, tok, args, what):
    """The streamed text equals decode(prompt + new) less decode(prompt)."""
    _, ids_out, _ = generate(model, ["--tokenizer", tok, "--print-ids"] + args)
    new = [int(x) for x in ids_out.split()]
    _, text, _ = generate(model, ["--tokenizer", tok, "--skip-prompt"] + args)
    _, with_prompt, _ = generate(model, ["--tokenizer", tok] + args)
    prompt = tokenize(tok, TEXT)
    full, head = tf.decode(tok, [prompt + new, prompt])
    want = (full[len(head):] + "\n").replace("\r\n", "\n").replace("\r", "\n")  # as text-mode pipes read it
    t.check(text == want and full.startswith(head),
            "%s: the streamed text of %d tokens is the decode of prompt + continuation less the prompt's (%r)"
            % (what, len(new), text[:60]))
    t.check(with_prompt == TEXT + text, "%s: without --skip-prompt the prompt comes first" % what)


check_stream(llama, LLAMA2, ["--prompt", TEXT, "--temperature", "0", "--max-new-tokens", "20"], "llama, Llama 2 tokenizer")
check_stream(BUILT["opt"][0], GPT2, ["--prompt", TEXT, "--temperature", "3", "--top-k", "0", "--max-new-tokens", "40",
                                     "--seed", "5"], "opt, byte-level GPT-2 tokenizer, sampled")

STREAM_TEXTS = ["Café crème brûlée, naïve façade — déjà vu.", "東京は日本の首都です。北京は中国の首都です。",
                "Emoji: 🙂🚀👩‍💻 done; mixed: Ωmega ≈ 3.14 ≥ π", "plain ascii text with spaces   and\ttabs"]
for tok, label in ((LLAMA3, "Llama 3"), (LLAMA2, "Llama 2")):
    held = 0
    for text in STREAM_TEXTS:
        ids = tokenize(tok, text)
        ctx = 3
        p = subprocess.run([os.path.join(t.TOOLS, "stream_check"), tok, str(ctx)], input=" ".join(map(str, ids)),
                           capture_output=True, text=True, env=t.ENV)
        if p.returncode != 0:
            t.fail("stream_check: %s" % p.stderr)
            continue
        pieces = [json.loads(l) for l in p.stdout.splitlines()]
        full, head = tf.decode(tok, [ids, ids[:ctx]])
        ok = "".join(pieces) == full[len(head):] and full.startswith(head)
        clean = "\ufffd" in full or not any("\ufffd" in x for x in pieces)
        held += sum(1 for x in pieces[:-1] if x == "")
        t.check(ok and clean, "%s stream of %r: %d pieces concatenate to the text, none with U+FFFD" % (label, text[:24], len(pieces)))
    t.check(held > 0, "%s: %d pushes were held back (characters split over tokens wait for their last byte)" % (label, held))

# ---- sampling ----------------------------------------------------------------------------------

qwen, _ = BUILT["qwen2"]
sample = ["--prompt-ids", " ".join(map(str, PROMPT)), "--print-ids", "--max-new-tokens", str(NEW), "--temperature", "8",
          "--top-k", "0"]
a = generate(qwen, sample + ["--seed", "1"])[1]
b = generate(qwen, sample + ["--seed", "1"])[1]
c = generate(qwen, sample + ["--seed", "2"])[1]
greedy, _ = greedy_ids(qwen, PROMPT)
t.check(a == b and a != c and [int(x) for x in a.split()] != greedy,
        "sampling: the same seed gives the same tokens, another seed others, neither the greedy ones")
for extra, what in ((["--top-k", "1"], "top-k 1"), (["--top-p", "1e-9"], "top-p 1e-9"),
                    (["--temperature", "1e-4"], "temperature 1e-4")):
    args = ["--prompt-ids", " ".join(map(str, PROMPT)), "--print-ids", "--max-new-tokens", str(NEW), "--seed", "3"]
    got = [int(x) for x in generate(qwen, args + (["--temperature", "5"] if "--temperature" not in extra else []) + extra)[1].split()]
    t.check(got == greedy, "sampling with %s gives the greedy tokens" % what)
gc_dir = os.path.join(D, "qwen2-genconfig")
shutil.copytree(qwen, gc_dir)
json.dump({"do_sample": False}, open(os.path.join(gc_dir, "generation_config.json"), "w"))
_, out, err = generate(gc_dir, ["--prompt-ids", " ".join(map(str, PROMPT)), "--print-ids", "--max-new-tokens", str(NEW)])
t.check([int(x) for x in out.split()] == greedy and "greedy" in err, "generation_config.json do_sample false: greedy by default")
json.dump({"do_sample": True, "temperature": 0.5, "top_k": 5, "top_p": 0.9}, open(os.path.join(gc_dir, "generation_config.json"), "w"))
_, out, err = generate(gc_dir, ["--prompt-ids", "1 2", "--print-ids", "--max-new-tokens", "2", "--top-k", "7"])
t.check("sampling (temperature 0.5, top-k 7, top-p 0.9" in err, "generation_config.json's sampling values are the "
        "defaults, flags win: %s" % [l for l in err.splitlines() if "sampling" in l][:1])

# ---- lengths and EOS ----------------------------------------------------------------------------

rc, out, err = generate(llama, ["--prompt", TEXT, "--max-new-tokens", "0", "--print-ids"])
t.check(rc == 0 and out == "\n", "--max-new-tokens 0: nothing generated")
full, _ = greedy_ids(llama, PROMPT)
stop = full[6]
k = full.index(stop)
eos_dir = os.path.join(D, "llama-eos")
shutil.copytree(llama, eos_dir)
json.dump({"eos_token_id": [31999, stop]}, open(os.path.join(eos_dir, "generation_config.json"), "w"))
got, err = greedy_ids(eos_dir, PROMPT)
t.check(got == full[:k + 1] and "stopped at end-of-sequence" in err,
        "EOS from generation_config.json's list: stops right after token %d (new token %d)" % (stop, k))
os.remove(os.path.join(eos_dir, "generation_config.json"))
cfg = json.load(open(os.path.join(eos_dir, "config.json")))
cfg["eos_token_id"] = [31998, stop]
json.dump(cfg, open(os.path.join(eos_dir, "config.json"), "w"))
got, err = greedy_ids(eos_dir, PROMPT)
t.check(got == full[:k + 1], "EOS from config.json's list when there is no generation_config.json")

# ---- bad inputs ---------------------------------------------------------------------------------

opt, opt_ck = BUILT["opt"]
trunc_ck = os.path.join(D, "truncated.h5")
data = open(os.path.join(opt_ck, "step-00000003.h5"), "rb").read()
open(trunc_ck, "wb").write(data[:len(data) // 2])
no_weights = os.path.join(D, "no-weights")
os.makedirs(no_weights, exist_ok=True)
shutil.copy(os.path.join(opt, "config.json"), no_weights)
trunc_st = os.path.join(D, "truncated-st")
shutil.copytree(opt, trunc_st)
blob = open(os.path.join(opt, "model.safetensors"), "rb").read()
open(os.path.join(trunc_st, "model.safetensors"), "wb").write(blob[:len(blob) - 1000])
bad_gc = os.path.join(D, "bad-genconfig")
shutil.copytree(qwen, bad_gc)
open(os.path.join(bad_gc, "generation_config.json"), "w").write('{"top_p": "high"}')
long_prompt = " ".join(["5"] * 129)
ids = ["--prompt-ids", "1 2 3"]
BAD = [
    (["--init-from", qwen, "--prompt", "hi"], 2, "needs a tokenizer"),
    (["--init-from", qwen, "--prompt", "hi", "--tokenizer", os.path.join(D, "none.json")], 1, "none.json"),
    (["--init-from", qwen, "--prompt", "hi", "--tokenizer", LLAMA2], 1, "beyond the model's vocabulary"),
    (["--init-from", opt, "--prompt-ids", long_prompt, "--print-ids"], 2, "more than the 128 positions"),
    (["--init-from", opt, "--prompt-ids", " ".join(["5"] * 100), "--print-ids", "--max-new-tokens", "40"], 2,
     "max_position_embeddings 128"),
    (["--init-from", qwen, "--prompt-ids", "1 5000", "--print-ids"], 2, "outside the model's vocabulary"),
    (["--init-from", qwen, "--prompt-ids", "1 x", "--print-ids"], 2, "'x' is not a token id"),
    (["--checkpoint", os.path.join(D, "nothing")] + ids + ["--print-ids"], 1, "no such file"),
    (["--checkpoint", trunc_ck] + ids + ["--print-ids"], 1, "truncated.h5"),
    (["--checkpoint", opt] + ids + ["--print-ids"], 2, "give it as --init-from"),
    (["--init-from", no_weights] + ids + ["--print-ids"], 1, "no model.safetensors"),
    (["--init-from", trunc_st] + ids + ["--print-ids"], 1, "model.safetensors"),
    (["--init-from", bad_gc] + ids + ["--print-ids"], 1, "generation_config.json: top_p"),
    (["--init-from", qwen, "--checkpoint", opt_ck] + ids, 2, "exactly one of --init-from"),
    (["--init-from", qwen, "--print-ids"], 2, "exactly one of --prompt"),
    (["--init-from", qwen, "--print-ids", "--top-p", "0"] + ids, 2, "--top-p"),
    (["--init-from", qwen, "--print-ids", "--temperature", "-1"] + ids, 2, "--temperature"),
    (["--init-from", opt, "--prompt-file", os.path.join(D, "none.txt"), "--tokenizer", GPT2], 1, "none.txt"),
]
for args, status, text in BAD:
    rc, out, err = fsdp(["generate", "--device", "cpu"] + args, check=False)
    lines = err.strip().splitlines()
    t.check(rc == status and len(lines) == 1 and lines[0].startswith("fsdp: error:") and text in lines[0],
            "bad input -> exit %d, one line with %r: %s" % (status, text, lines[-1][:150] if lines else "(nothing)"))
rc, out, err = fsdp(["generate", "--init-from", qwen] + ids + ["--print-ids"], check=False, nprocs=2)
errors = [l for l in err.splitlines() if l.startswith("fsdp: error:")]
t.check(rc != 0 and len(errors) == 1 and "one process" in errors[0], "two MPI ranks: one line (%s)" % errors[:1])

t.finish()
