import gc, sys, time, importlib.abc, importlib.machinery
t0 = time.perf_counter()
class _Loader(importlib.abc.Loader):
    def __init__(self, real): self.real = real
    def create_module(self, spec): return self.real.create_module(spec)
    def exec_module(self, module):
        was = gc.isenabled(); gc.disable()
        try: self.real.exec_module(module)
        finally:
            gc.freeze()
            if was: gc.enable()
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch": return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None: spec.loader = _Loader(spec.loader)
        return spec
if sys.argv[1] == "hook": sys.meta_path.insert(0, _Finder())
import torch
t1 = time.perf_counter()
x = torch.randn(10); print(sys.argv[1], round(t1 - t0, 3), torch.__file__, gc.isenabled(), gc.get_freeze_count())
