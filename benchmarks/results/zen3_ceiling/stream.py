"""How fast one core reads memory here: the best of 10 ``sum`` calls over float32 tensors of
1-256 MiB (1-4 MiB fit the caches; from 16 MiB on the reads come from memory).

    python benchmarks/results/zen3_ceiling/stream.py
"""
import os
import time

import torch

torch.set_num_threads(1)
print(f"load {os.getloadavg()}")
for mebibytes in (1, 4, 16, 64, 256):
    x = torch.randn(mebibytes * 2 ** 18)
    x.sum()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    print(f"{mebibytes} MiB: {mebibytes * 2 ** 20 / min(times) / 1e9:.1f} GB/s")
