"""Translate's batch budget (batch_tokens), translators of each budget alternated in one process.
Usage: python benchmarks/results/zen3_ceiling/batch_tokens_inproc.py BEAM DTYPE BUDGETS ROUNDS THREADS LINES WORKERS MODEL_DIR SOURCE"""
import sys, time, statistics, resource
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
from nmtkit.runtime.console import get_console
from nmtkit.translate_files import open_translator, resolve_options
beam=int(sys.argv[1]); dtype=sys.argv[2]; budgets=[int(x) for x in sys.argv[3].split(',')]; rounds=int(sys.argv[4]); threads=int(sys.argv[5]); nl=int(sys.argv[6])
M=sys.argv[8]
trs={b: open_translator([M], resolve_options([M], {"beam_size": beam, "batch_tokens": b}, device="cpu", engine="torch", threads=threads, dtype=dtype, workers=int(sys.argv[7])), get_console(-1)) for b in budgets}
lines=[l.rstrip("\n") for l in open(sys.argv[9])][:nl]
outs={b:trs[b].translate(lines) for b in budgets}
res={b:[] for b in budgets}
for r in range(rounds):
    for b in (budgets if r%2==0 else budgets[::-1]):
        t=time.perf_counter(); trs[b].translate(lines); dt=time.perf_counter()-t
        res[b].append(len(lines)/dt); print(r,b,round(len(lines)/dt,2),flush=True)
for b in budgets: print(b, 'mean %.2f'%statistics.mean(res[b]), [round(x,2) for x in res[b]], 'same as first:', sum(x==y for x,y in zip(outs[b],outs[budgets[0]])))
print('maxrss MiB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024)
