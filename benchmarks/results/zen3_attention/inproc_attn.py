"""In-process A/B over the same lines, alternated: decoder attention through PyTorch's SDPA
(now) against explicit matmuls with a float32 softmax for short query blocks (candidate).
Usage: inproc_attn.py MODEL SRC N ROUNDS THREADS BEAM DTYPE"""
import json, os, sys, time
sys.path.insert(0, "/work/main/benchmarks")
import torch
import torch.nn.functional as F
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
import decode_speed
from nmtkit.models import layers, transformer

model, src, n, rounds, threads, beam, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
torch.set_num_threads(threads)
now = layers.sdpa

def explicit(q, k, v, mask, dropout, causal=False):
    if q.size(-2) > 8 or causal or dropout > 0 or (mask is not None and mask.dtype != torch.bool) or q.dtype != torch.float32:
        return now(q, k, v, mask, dropout, causal)
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v

def use(f):
    layers.sdpa = f; transformer.sdpa = f

lines = open(src, encoding="utf-8").read().splitlines()[:n]
cfg = dict(engine="torch", beam=beam, batch_tokens=8000, device="cpu", workers=0, model=model, dtype=dtype)
tr = decode_speed.make_translator(cfg)
tr.translate(lines[:20])
variants = [("sdpa", now), ("explicit", explicit)]
res = {v: [] for v, _ in variants}; outs = {}
print("load", os.getloadavg(), flush=True)
for r in range(rounds):
    for name, f in (variants if r % 2 == 0 else variants[::-1]):
        use(f)
        t = time.perf_counter(); out = tr.translate(lines); dt = time.perf_counter() - t
        res[name].append(round(n / dt, 2)); outs.setdefault(name, out)
        print(r, name, round(n / dt, 2), "sent/s", flush=True)
use(now)
print(json.dumps({"res": res, "same_lines": sum(a == b for a, b in zip(outs["sdpa"], outs["explicit"])),
                  "lines": n, "beam": beam, "threads": threads, "dtype": dtype, "load": os.getloadavg()}))
