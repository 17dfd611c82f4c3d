#!/usr/bin/env python3
"""PyTorch's causal attention at attention_bench's shapes: the reference for fsdp.c's flash kernels.

Times torch.nn.functional.scaled_dot_product_attention (bf16, is_causal=True, [B, H, T, D]; grouped
query heads through enable_gqa) forward and backward with each backend PyTorch has on the GPU (flash =
FlashAttention-2, cudnn, efficient), and prints TFLOP/s with attention_bench's convention (forward =
2 B Hq T^2 D for the two causal products, backward = 2.5 x forward). Each figure is the median of 20
timed runs (CUDA events) after 3 warm-up runs. Not a test; needs a GPU and PyTorch.

  python3 bench/sdpa_bench.py          # beside build/bench/attention_bench, in the same call
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 2048, 32, 8, 64), (32, 1024, 32, 8, 64), (4, 2048, 32, 32, 128), (5, 4096, 32, 32, 128)]
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def median_ms(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    if not torch.cuda.is_available():
        print("sdpa_bench: no GPU, nothing to time")
        return 0
    print("sdpa_bench on %s: torch %s, causal, bf16" % (torch.cuda.get_device_name(), torch.__version__))
    for B, T, Hq, Hkv, D in SHAPES:
        q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16)
        fwd_flop = 2.0 * B * Hq * T * T * D
        for name, backend in BACKENDS:
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
                    fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                           enable_gqa=Hq != Hkv))
                    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
            except RuntimeError as e:
                print("B=%-3d T=%-5d Hq=%-3d Hkv=%-3d D=%-4d  %-9s not available: %s" %
                      (B, T, Hq, Hkv, D, name, str(e).splitlines()[0][:80]))
                continue
            print("B=%-3d T=%-5d Hq=%-3d Hkv=%-3d D=%-4d  %-9s fwd %8.3f ms %7.1f TFLOP/s   bwd %8.3f ms %7.1f TFLOP/s" %
                  (B, T, Hq, Hkv, D, name, fwd, fwd_flop / fwd / 1e9, bwd, 2.5 * fwd_flop / bwd / 1e9))
        del q, k, v, do
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
