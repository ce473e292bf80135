"""Scores alone vs batched, float32 and int8, at 1 and 2 threads (bitwise)."""
import os, sys, torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # ran with /work/main/benchmarks here
import decode_speed
from nmtkit.models import layers, transformer
def explicit(q, k, v, mask, dropout, causal=False):
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-1, -2)
    if causal:
        t, s_len = scores.shape[-2:]
        mask = torch.ones(t, s_len, dtype=torch.bool).tril(s_len - t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v
layers.sdpa = explicit; transformer.sdpa = explicit
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()[:int(sys.argv[3])]
for dtype in ("float32", "int8"):
    tr = decode_speed.make_translator(dict(engine="torch", beam=4, batch_tokens=8000, device="cpu", workers=0,
                                           model=sys.argv[1], dtype=dtype))
    eng = tr.engine
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ids = [eng.src_vocab.encode(l) for l in lines]
        src, mask = eng.batch(ids)
        batched = eng.search(src, mask)
        diff_scores = diff_tokens = 0
        for i, one in enumerate(ids):
            s, m = eng.batch([one])
            alone = eng.search(s, m)[0][0]
            b = batched[i][0]
            diff_scores += alone.score != b.score
            diff_tokens += alone.tokens != b.tokens
        print(dtype, threads, "threads: scores differ", diff_scores, "tokens differ", diff_tokens, "of", len(ids), flush=True)
