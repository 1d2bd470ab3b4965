#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on the shapes of bench_attn.c's prefill benchmark
(4 sequences x 1024, 2048 and 4096 tokens, 32 query heads, 8 KV heads, head_dim 128, bf16, causal).
Prints "RESULT sdpa_prefill_b4_L<L>_tflops <x> TFLOP/s" lines with the same FLOP formula.
Exits 77 when torch or a CUDA device is missing."""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("sdpa_ref: torch is not importable, skipping")
    sys.exit(77)

if not torch.cuda.is_available():
    print("sdpa_ref: no CUDA device, skipping")
    sys.exit(77)

N, H, KVH, HD = 4, 32, 8, 128
for L in (1024, 2048, 4096):
    q = torch.randn(N, H, L, HD, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(N, KVH, L, HD, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(N, KVH, L, HD, device="cuda", dtype=torch.bfloat16)
    # GQA: expand KV heads (enable_gqa exists only in newer torch).
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 10
    start.record()
    for _ in range(iters):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    flops = N * H * 4.0 * L * L * HD / 2.0
    print(f"sdpa prefill: {N} x {L} tokens, causal, {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")
    print(f"RESULT sdpa_prefill_b{N}_L{L}_tflops {flops / ms / 1e9:.2f} TFLOP/s")
