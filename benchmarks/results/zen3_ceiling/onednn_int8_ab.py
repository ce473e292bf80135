"""int8 products through oneDNN's qlinear (the rows quantised here, 7 bits, a scale per row as
Int8Linear does) against fbgemm's (Int8Linear as shipped), alternated in one process; tried, not
kept. Usage: python benchmarks/results/zen3_ceiling/onednn_int8_ab.py BEAM LINES ROUNDS MODEL_DIR SOURCE"""
import sys, time, statistics, warnings
from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory
keep_freed_memory(); bound_kernel_caches()
import torch
from nmtkit.models import quantize as Q
from nmtkit.runtime.console import get_console
from nmtkit.translate_files import open_translator, resolve_options

fb_forward = Q.Int8Linear.forward
def onednn_forward(self, x):
    rows = x.reshape(-1, self.in_features).float()
    if not hasattr(self, 'odnn'):
        w = self.wf
        ws = (w.abs().amax(1).double() / 127).clamp_min(1e-12)
        wq = torch.round(w / ws[:, None]).clamp(-127, 127).to(torch.int8)
        self.odnn = (torch.ops.onednn.qlinear_prepack(wq, None), ws.float(), torch.zeros(w.size(0), dtype=torch.long))
    pk, ws, wzp = self.odnn
    peak = torch.maximum(rows.amax(1, keepdim=True), rows.amin(1, keepdim=True).neg_()).clamp_min_(1e-30)
    q = rows.mul(Q.STEPS / peak).round_().add_(Q.ZERO_POINT).to(torch.int16).to(torch.uint8)
    out = torch.ops.onednn.qlinear_pointwise(q, 1.0 / Q.STEPS, Q.ZERO_POINT, pk, ws, wzp, None, 1.0, 0, torch.float32, "none", [], "")
    out = out.mul_(peak) if self.bias is None else torch.addcmul(self.bias, out, peak, out=out)
    return out.view(*x.shape[:-1], self.out_features)
orig_init = Q.Int8Linear.__init__
def init(self, linear):
    orig_init(self, linear); self.wf = linear.weight.detach().float().clone()
Q.Int8Linear.__init__ = init

beam=int(sys.argv[1]); n=int(sys.argv[3]); threads=1
options = resolve_options([sys.argv[-2]], {"beam_size": beam}, device="cpu", engine="torch", threads=threads, dtype="int8", workers=1)
tr = open_translator([sys.argv[-2]], options, get_console(-1))
lines=[l.rstrip("\n") for l in open(sys.argv[-1])][:int(sys.argv[2])]
impl={'fbgemm':fb_forward,'onednn':onednn_forward}
outs={}; res={k:[] for k in impl}
for name,f in impl.items():
    Q.Int8Linear.forward=f; outs[name]=tr.translate(lines)
for r in range(n):
    for name in (list(impl) if r%2==0 else list(impl)[::-1]):
        Q.Int8Linear.forward=impl[name]
        t=time.perf_counter(); o=tr.translate(lines); dt=time.perf_counter()-t
        res[name].append(len(lines)/dt); print(r,name,round(len(lines)/dt,2),flush=True)
same=sum(a==b for a,b in zip(outs['fbgemm'],outs['onednn']))
print('same lines', same, 'of', len(lines))
for k,v in res.items(): print(k, round(statistics.mean(v),2), [round(x,2) for x in v])
print('ratio onednn/fbgemm by round', [round(a/b,3) for a,b in zip(res['onednn'],res['fbgemm'])])
