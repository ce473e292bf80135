"""One-query attention on CPU float32: PyTorch's SDPA against explicit matmuls (best of N)."""
import sys, time
import torch
import torch.nn.functional as F

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
H, D = 4, 64

def explicit(q, k, v, mask):
    s = (q * D ** -0.5) @ k.transpose(-1, -2)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v

def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

def bench(f, *a, n=300):
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f(*a)
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6

g = torch.Generator().manual_seed(0)
with torch.inference_mode():
    for rows in (32, 128, 256):
        for T, masked in ((5, False), (20, False), (40, False), (30, True)):
            q = torch.randn(rows, H, 1, D, generator=g)
            k = torch.randn(rows, H, T, D, generator=g)
            v = torch.randn(rows, H, T, D, generator=g)
            mask = None
            if masked:
                mask = torch.ones(rows, 1, 1, T, dtype=torch.bool)
                mask[::2, ..., T - 7:] = False
            a, b = bench(sdpa, q, k, v, mask), bench(explicit, q, k, v, mask)
            err = (sdpa(q, k, v, mask) - explicit(q, k, v, mask)).abs().max().item()
            print(f"rows {rows:4d} T {T:3d} mask {masked!s:5}: sdpa {a:8.1f} us  explicit {b:8.1f} us  ratio {a/b:5.2f}  maxdiff {err:.1e}")
