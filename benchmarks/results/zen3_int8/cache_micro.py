"""One thread: a decoder step's cache update, reorder rows then append one step, for one layer's
keys [N, H, t, D] at beam-search sizes. (A) index_select then cat (two copies, contiguous);
(B) index_select into the first t steps of the new cache (one copy, into a strided slice)."""
import time, torch
from nmtkit.models.transformer import extend_cache
torch.set_num_threads(1)

def bench(fn, reps=300):
    for _ in range(20): fn()
    best = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps): fn()
        best.append((time.perf_counter() - t) / reps * 1e6)
    return min(best)

print("rows  t | A: select+cat  B: one copy (us, best of 3)")
for n, t in [(280, 5), (280, 20), (280, 40), (40, 20)]:
    past, new = torch.randn(n, 4, t, 64), torch.randn(n, 4, 1, 64)
    order = torch.randint(0, n, (n,))
    a = lambda: torch.cat([past.index_select(0, order), new], 2)
    b = lambda: extend_cache(past, new, order)
    assert torch.equal(a(), b())
    print(f"{n:4d} {t:3d} | {bench(a):12.1f} {bench(b):12.1f}")
