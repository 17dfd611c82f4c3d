"""How far an all-gather and a reduce-scatter running at the same time on a link keep their own speed:
the `--link-concurrency` of `fsdp plan` (src/train/timeline.h), measured.

fsdp.c's engine gathers on one stream and reduces on another, each through its own NCCL communicator,
so in the backward the two collectives overlap. On one NIC they share its bandwidth (each at half
speed: concurrency 0); NCCL's socket transport between two GPUs of one host (the Ethernet-class
emulation of bench/links.py: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) gives each communicator its own
connections and threads, and may let both run at nearly full speed (concurrency 1). This program
times, through PyTorch and two NCCL communicators over the same ranks:

  t_ag    an all-gather alone (bf16, SIZE MiB gathered)
  t_rs    a reduce-scatter alone (fp32, SIZE MiB reduced: the fp32 gradient reductions)
  t_both  both at once, each on its own CUDA stream and communicator

and prints concurrency = 1 - (t_both - longer) / shorter: 0 when t_both = t_ag + t_rs (they take
turns), 1 when t_both = the longer alone (neither slows the other). The timeline's model (each runs
at 1 / (2 - C) while both run) gives exactly this t_both for C.

Usage (one host, 2 GPUs; the link's variables in the environment, as bench/links.py sets them):
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 torchrun --nproc_per_node 2 bench/link_concurrency.py [--size MiB]
It prints one line "RESULT {...}" (JSON) on rank 0. Not a test."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def timed(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="MiB gathered and MiB reduced per collective")
    p.add_argument("--reps", type=int, default=8)
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    ranks = list(range(world))
    gather_group, reduce_group = dist.new_group(ranks), dist.new_group(ranks)  # two communicators
    n16 = args.size * 2**20 // 2
    n32 = args.size * 2**20 // 4
    full16 = torch.randn(n16, device="cuda", dtype=torch.bfloat16)
    shard16 = torch.empty(n16 // world, device="cuda", dtype=torch.bfloat16)
    full32 = torch.randn(n32, device="cuda", dtype=torch.float32)
    shard32 = torch.empty(n32 // world, device="cuda", dtype=torch.float32)
    gs, rs = torch.cuda.Stream(), torch.cuda.Stream()

    def gather():
        with torch.cuda.stream(gs):
            dist.all_gather_into_tensor(full16, shard16, group=gather_group)

    def reduce():
        with torch.cuda.stream(rs):
            dist.reduce_scatter_tensor(shard32, full32, group=reduce_group)

    def both():
        gather()
        reduce()

    t_ag, t_rs, t_both = timed(gather, args.reps), timed(reduce, args.reps), timed(both, args.reps)
    longer, shorter = max(t_ag, t_rs), min(t_ag, t_rs)
    conc = 1.0 - (t_both - longer) / shorter
    busbw = lambda nbytes, t: round(nbytes * (world - 1) / world / t / 1e9, 2)
    res = dict(size_mib=args.size, world=world, t_all_gather_ms=round(t_ag * 1e3, 2),
               t_reduce_scatter_ms=round(t_rs * 1e3, 2), t_both_ms=round(t_both * 1e3, 2),
               all_gather_busbw=busbw(n16 * 2, t_ag), reduce_scatter_busbw=busbw(n32 * 4, t_rs),
               concurrency=round(conc, 3),
               link={k: os.environ[k] for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") if k in os.environ})
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
