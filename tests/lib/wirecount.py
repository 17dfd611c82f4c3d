"""The bytes fsdp.c's collectives move, counted from a checkpoint's tensors and the engine's layout rules
(src/model/layout.h units, src/shard shard alignment, src/base/dtype.h element sizes), so a test can hold
the engine's own comm_bytes against an independent count. Shared by compression.py and hpz.py."""
import math
import re

import fsdptest as t

SHARD_ALIGN = 64  # FSDP_SHARD_ALIGN: every rank's shard of a unit is a multiple of it


def units(ckpt_path):
    """Elements of each FSDP unit: (EMBED, [one per layer], HEAD); a tied embedding counts in EMBED."""
    arrays = {k: v for k, v in t.checkpoint_arrays(ckpt_path).items() if not k.startswith("optimizer/")}
    embed = sum(v.size for k, v in arrays.items() if k.startswith("model.embed"))
    layers = {}
    for k, v in arrays.items():
        m = re.match(r"model\.layers\.(\d+)\.", k)
        if m:
            layers[int(m.group(1))] = layers.get(int(m.group(1)), 0) + v.size
    head = sum(v.size for k, v in arrays.items() if k in ("model.norm.weight", "lm_head.weight"))
    return embed, [layers[i] for i in sorted(layers)], head


def padded(numel, shards):
    """A unit's elements padded so that each of `shards` ranks holds an aligned, equal piece."""
    align = shards * SHARD_ALIGN
    return (numel + align - 1) // align * align


def shard_len(numel, shards):
    """Elements of one rank's shard of a unit."""
    return padded(numel, shards) // shards


def wire(dtype, count):
    """Bytes of one piece of `count` elements on the wire (int8: values, then one fp32 scale per 256,
    each part padded to 16 bytes)."""
    if dtype == "int8":
        return (count + 15) // 16 * 16 + (math.ceil(count / 256) * 4 + 15) // 16 * 16
    return count * {"fp32": 4, "bf16": 2}[dtype]
