"""Micro: per-row int8 (_int_mm) vs float32 packed linear vs quantize_dynamic, 1 thread."""
import time, torch, sys
from torch import nn
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
from nmtkit.models.prepack import _packed_linear
def bench(f, n=200):
    for _ in range(10): f()
    t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e6
torch.manual_seed(0)
for M in (16, 64, 256):
  for K, N in ((256, 256), (256, 768), (256, 1024), (1024, 256), (256, 8000)):
    w = torch.randn(N, K); b = torch.randn(N); x = torch.randn(M, K)
    with torch.inference_mode():
        pk = torch.ops.mkldnn._reorder_linear_weight(w, None)
        ws = w.abs().amax(1) / 127; wq = (w / ws[:, None]).round().clamp(-127, 127).to(torch.int8).t().contiguous()
        xq = torch.randint(-127, 127, (M, K), dtype=torch.int8)
        q = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(K, N)), {nn.Linear}, dtype=torch.qint8)
        def rowint8():
            xs = x.abs().amax(1, keepdim=True).clamp_min(1e-8) / 127
            xi = (x / xs).round_().to(torch.int8)
            return torch._int_mm(xi, wq).float().mul_(xs).mul_(ws).add_(b)
        t_f = bench(lambda: _packed_linear(x, pk, b))
        t_mm = bench(lambda: torch._int_mm(xq, wq))
        t_row = bench(rowint8)
        t_q = bench(lambda: q(x))
        err = (rowint8() - nn.functional.linear(x, w, b)).abs().max().item()
    print(f"M{M:4d} K{K:5d} N{N:5d}  f32 packed {t_f:8.1f}us  int_mm {t_mm:8.1f}  row-int8 total {t_row:8.1f}  dyn-q {t_q:8.1f}  "
          f"x f32: int_mm {t_f/t_mm:4.2f} row {t_f/t_row:4.2f} dynq {t_f/t_q:4.2f}  err {err:.3f}", flush=True)
