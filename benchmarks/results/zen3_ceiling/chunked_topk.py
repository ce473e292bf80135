"""A top-k for beam search over [n, beam * V] candidates: the best block maxima first (blocks of 64),
then top-k over those blocks only; exact (the same values and indices as torch.topk on 300 random
cases). Run: python benchmarks/results/zen3_ceiling/chunked_topk.py (checks and times it against torch.topk, one thread)."""
import torch, time
torch.set_num_threads(1)
CHUNK=64
def chunked_topk(cand, k):
    n, width = cand.shape
    if width < 8 * k * CHUNK or width % CHUNK:  # small or ragged rows: torch.topk as is
        return cand.topk(k, dim=1)
    blocks = cand.view(n, width // CHUNK, CHUNK)
    best_blocks = blocks.amax(2).topk(k, dim=1).indices.sort(dim=1).values  # [n, k], ascending
    picked = blocks.gather(1, best_blocks[:, :, None].expand(n, k, CHUNK)).view(n, k * CHUNK)
    values, where = picked.topk(k, dim=1)
    index = best_blocks.gather(1, where // CHUNK) * CHUNK + where % CHUNK
    return values, index
def bench(f, n=50):
    f(); f()
    best=1e9
    for _ in range(5):
        t=time.perf_counter()
        for _ in range(n): f()
        best=min(best,(time.perf_counter()-t)/n)
    return best*1e6
if __name__ == "__main__":
    g=torch.Generator().manual_seed(0)
    bad=0
    for trial in range(300):
        n=int(torch.randint(1,80,(1,),generator=g)); V=8000; beam=4
        lp=torch.log_softmax(torch.randn(n*beam,V,generator=g)*3,-1)
        sc=torch.randn(n,beam,generator=g)
        if trial%3==0: sc[:,1:]=float('-inf')
        cand=(sc.view(n*beam,1)+lp).view(n,beam*V)
        a=tuple(cand.topk(8,dim=1)); b=tuple(chunked_topk(cand,8))
        if not (torch.equal(a[0],b[0]) and torch.equal(a[1],b[1])): bad+=1
    print('mismatches', bad, 'of 300')
    for n in [4, 26, 70]:
        cand=torch.randn(n,32000)
        print(n,'topk %.0f us, chunked %.0f us'%(bench(lambda: cand.topk(8,dim=1)), bench(lambda: chunked_topk(cand,8))))
