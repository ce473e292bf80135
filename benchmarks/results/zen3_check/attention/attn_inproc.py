"""In-process A/B: float32 CPU decoding with SDPA (now) vs explicit matmuls for short queries
(decoder steps), alternated over the same lines in one process. Usage: attn_inproc.py MODEL SRC N ROUNDS THREADS"""
import sys, time, json
sys.path.insert(0, "/work/main/benchmarks")
import torch
import torch.nn.functional as F
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
import decode_speed
from nmtkit.models import layers, transformer

model, src, n, rounds, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
orig = layers.sdpa

def explicit(q, k, v, mask, dropout, causal=False):
    if q.device.type == "cpu" and q.size(-2) <= 16 and not causal and dropout == 0.0 and (mask is None or mask.dtype == torch.bool):
        scores = (q * q.size(-1) ** -0.5) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v
    return orig(q, k, v, mask, dropout, causal)

def use(fn):
    layers.sdpa = fn; transformer.sdpa = fn

lines = open(src, encoding="utf-8").read().splitlines()[:n]
cfg = dict(engine="torch", dtype="float32", beam=4, batch_tokens=8000, device="cpu", workers=int(sys.argv[6]) if len(sys.argv) > 6 else 0, model=model)
tr = decode_speed.make_translator(cfg)
tr.translate(lines[:20])
res = {"sdpa": [], "explicit": []}; outs = {}
print("load", __import__("os").getloadavg(), flush=True)
for r in range(rounds):
    order = ("sdpa", "explicit") if r % 2 == 0 else ("explicit", "sdpa")
    for name in order:
        use(orig if name == "sdpa" else explicit)
        t = time.perf_counter(); out = tr.translate(lines); dt = time.perf_counter() - t
        res[name].append(round(n / dt, 2)); outs.setdefault(name, out)
        print(r, name, round(n / dt, 2), "sent/s", flush=True)
same = sum(a == b for a, b in zip(outs["sdpa"], outs["explicit"]))
print(json.dumps({"res": res, "same_lines": same, "lines": n, "load": __import__("os").getloadavg()}))
