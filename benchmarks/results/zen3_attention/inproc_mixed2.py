"""In-process A/B over the same lines, alternated: attention through SDPA at inference (before)
against explicit over the source's keys only ("mixed"), float32 and int8; and how many of the
first ALONE lines (env, default 300) each translates the same alone as batched.
Usage: ALONE=150 inproc_mixed2.py MODEL SRC N ROUNDS THREADS BEAM"""
import json, os, sys, time
import torch
import torch.nn.functional as F
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import decode_speed
from nmtkit.models import layers, transformer

model, src, n, rounds, threads, beam = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
ALONE = int(os.environ.get("ALONE", "300"))
now = layers.sdpa

def before(q, k, v, mask, dropout, causal=False):  # the previous rule: SDPA unless CPU bf16
    if q.dtype == torch.bfloat16:
        return now(q, k, v, mask, dropout, causal)
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)

def mixed(q, k, v, mask, dropout, causal=False):  # explicit over source keys only (encoder: as many keys as queries)
    return now(q, k, v, mask, dropout, causal) if q.size(-2) == k.size(-2) else before(q, k, v, mask, dropout, causal)

def use(f):
    if f is mixed:
        layers.sdpa = mixed; transformer.sdpa = now
    else:
        layers.sdpa = f; transformer.sdpa = f

lines = open(src, encoding="utf-8").read().splitlines()[:n]
cfg = dict(engine="torch", beam=beam, batch_tokens=8000, device="cpu", workers=0, model=model)
tr = {d: decode_speed.make_translator({**cfg, "dtype": d}) for d in ("float32", "int8")}
for t in tr.values():
    t.translate(lines[:20])
variants = [("f32-sdpa", "float32", before), ("f32-mixed", "float32", mixed), ("int8-sdpa", "int8", before), ("int8-mixed", "int8", mixed)]
res = {v: [] for v, _, _ in variants}; outs = {}
print("load", os.getloadavg(), flush=True)
for r in range(rounds):
    for name, d, f in (variants if r % 2 == 0 else variants[::-1]):
        use(f)
        t = time.perf_counter(); out = tr[d].translate(lines); dt = time.perf_counter() - t
        res[name].append(round(n / dt, 2)); outs.setdefault(name, out)
        print(r, name, round(n / dt, 2), "sent/s", flush=True)
alone = {}
for name, d, f in variants:  # each line alone (its own batch) against the batched run
    use(f)
    alone[name] = sum(tr[d].translate([line])[0] == batched for line, batched in zip(lines[:ALONE], outs[name][:ALONE]))
use(now)
print(json.dumps({"res": res, "same_lines_alone_as_batched_of_ALONE": alone,
                  
                  
                  "same_lines_f32_mixed_vs_sdpa": sum(a == b for a, b in zip(outs["f32-mixed"], outs["f32-sdpa"])),
                  "lines": n, "alone_lines": ALONE, "beam": beam, "threads": threads, "load": os.getloadavg()}))
