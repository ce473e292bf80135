"""Decoder steps of line i alone vs in the batch of N lines (float32, 1 thread): first differing sdpa call."""
import os, sys, torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # ran with /work/main/benchmarks here
import decode_speed
from nmtkit.models import layers, transformer
torch.set_num_threads(1)
tr = decode_speed.make_translator(dict(engine="torch", beam=4, batch_tokens=8000, device="cpu", workers=0,
                                       model=sys.argv[1], dtype="float32"))
eng = tr.engine; model = eng.model
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()[:int(sys.argv[3])]
ids = [eng.src_vocab.encode(l) for l in lines]
calls = []
orig = layers.sdpa
def spy(q, k, v, mask, dropout, causal=False):
    out = orig(q, k, v, mask, dropout, causal)
    calls.append((tuple(q.shape), tuple(k.shape), mask is not None, out.clone()))
    return out
layers.sdpa = spy; transformer.sdpa = spy
steps = 8
with torch.inference_mode():
    src, mask = eng.batch(ids)
    calls.clear(); enc = model.encode(src, mask); state = model.init_state(enc, 1)
    prev = torch.full((len(ids),), 1, dtype=torch.long); out_b = []
    for step in range(steps):
        logits, state = model.decode_step(prev, enc, state, False); out_b.append(logits.clone()); prev = torch.full_like(prev, 10 + step)
    calls_b = list(calls)
    for i in range(min(10, len(ids))):
        calls.clear(); s, m = eng.batch([ids[i]]); enc = model.encode(s, m); st = model.init_state(enc, 1)
        prev = torch.full((1,), 1, dtype=torch.long); eq = []
        for step in range(steps):
            logits, st = model.decode_step(prev, enc, st, False); eq.append(torch.equal(logits[0], out_b[step][i])); prev = torch.full_like(prev, 10 + step)
        first = None
        for j, (ca, cb) in enumerate(zip(calls, calls_b)):
            n = ca[3].size(2) if ca[3].size(0) == 1 and len(ca[0]) == 4 else None
            a = ca[3][0]; b = cb[3][i] if cb[3].size(0) == len(ids) else None
            if b is None: continue
            if a.shape != b.shape: b = b[:, :a.size(1)]
            if not torch.equal(a, b): first = (j, ca[:3], cb[:3], (a - b).abs().max().item()); break
        print(i, len(ids[i]), "logits equal per step", "".join("1" if e else "0" for e in eq), "first differing sdpa", first)
