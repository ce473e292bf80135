"""beam_step with chunked_topk against torch.topk, alternated in one process (1 thread, the first
300 lines). python benchmarks/results/zen3_ceiling/chunked_topk_ab.py BEAM DTYPE ROUNDS MODEL_DIR SOURCE"""
import sys, time, statistics
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
import nmtkit.decoding.search as S
from nmtkit.runtime.console import get_console
from nmtkit.translate_files import open_translator, resolve_options
from chunked_topk import chunked_topk  # noqa: E402  (this script's folder is on sys.path)
orig=S.beam_step
def new_step(scores, lprobs):
    n, beam = scores.shape
    vocab = lprobs.size(1)
    cand = (scores.view(n * beam, 1) + lprobs).view(n, beam * vocab)
    top_scores, top_index = chunked_topk(cand, min(2 * beam, beam * vocab))
    return top_scores, top_index // vocab, top_index % vocab
beam=int(sys.argv[1]); n=int(sys.argv[3]); M=sys.argv[4]
options = resolve_options([M], {"beam_size": beam}, device="cpu", engine="torch", threads=1, dtype=sys.argv[2], workers=1)
tr = open_translator([M], options, get_console(-1))
lines=[l.rstrip("\n") for l in open(sys.argv[5])][:300]
impl={'topk':orig,'chunked':new_step}
outs={}; res={k:[] for k in impl}
for name,f in impl.items():
    S.beam_step=f; outs[name]=tr.translate(lines)
for r in range(n):
    for name in (list(impl) if r%2==0 else list(impl)[::-1]):
        S.beam_step=impl[name]
        t=time.perf_counter(); o=tr.translate(lines); dt=time.perf_counter()-t
        res[name].append(len(lines)/dt); print(r,name,round(len(lines)/dt,2),flush=True)
print('same lines', sum(a==b for a,b in zip(outs['topk'],outs['chunked'])), 'of', len(lines))
for k,v in res.items(): print(k, round(statistics.mean(v),2), [round(x,2) for x in v])
print('ratio chunked/topk by round', [round(a/b,3) for a,b in zip(res['chunked'],res['topk'])])
