"""In-process A/B over the same lines, alternated: float32 with the deferred cache reorder (now),
float32 with eager cache copies at each select (before), and int8 (row by row, deferred).
Usage: inproc.py MODEL SRC N ROUNDS THREADS BEAM"""
import json, os, sys, time
sys.path.insert(0, "/work/main/benchmarks")
import torch
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
import decode_speed
from nmtkit.models.base import Selectable
from nmtkit.models.transformer import TransformerState

model, src, n, rounds, threads, beam = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
deferred_select = TransformerState.select

def use(deferred: bool):
    TransformerState.deferred = ("self_kv", "order") if deferred else ()
    TransformerState.select = deferred_select if deferred else Selectable.select

lines = open(src, encoding="utf-8").read().splitlines()[:n]
cfg = dict(engine="torch", beam=beam, batch_tokens=8000, device="cpu", workers=0, model=model)
tr = {"f32": decode_speed.make_translator({**cfg, "dtype": "float32"}),
      "int8": decode_speed.make_translator({**cfg, "dtype": "int8"})}
for t in tr.values():
    t.translate(lines[:20])
variants = [("f32-deferred", "f32", True), ("f32-eager", "f32", False), ("int8", "int8", True)]
res = {v: [] for v, _, _ in variants}; outs = {}
print("load", os.getloadavg(), flush=True)
for r in range(rounds):
    for name, which, deferred in (variants if r % 2 == 0 else variants[::-1]):
        use(deferred)
        t = time.perf_counter(); out = tr[which].translate(lines); dt = time.perf_counter() - t
        res[name].append(round(n / dt, 2)); outs.setdefault(name, out)
        print(r, name, round(n / dt, 2), "sent/s", flush=True)
use(True)
print(json.dumps({"res": res, "same_lines_deferred_vs_eager": sum(a == b for a, b in zip(outs["f32-deferred"], outs["f32-eager"])),
                  "same_lines_int8_vs_f32": sum(a == b for a, b in zip(outs["f32-deferred"], outs["int8"])),
                  "lines": n, "beam": beam, "threads": threads, "load": os.getloadavg()}))
