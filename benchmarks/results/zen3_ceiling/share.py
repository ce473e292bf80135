"""What share of a search its Linear products take: translate LINES lines (the first of SOURCE)
as ``nmtkit translate`` does (one thread, one batch at a time), counting every Linear product's
multiply-adds and timing each call with forward hooks, then the same search timed without hooks
(best of 3).

    python benchmarks/results/zen3_ceiling/share.py MODEL_DIR SOURCE LINES BEAM DTYPE
"""
import os
import sys
import time

from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

keep_freed_memory()  # as the CLI does, before torch loads
bound_kernel_caches()
from nmtkit.models.prepack import PackedLinear  # noqa: E402
from nmtkit.models.quantize import Int8Linear  # noqa: E402
from nmtkit.runtime.console import get_console  # noqa: E402
from nmtkit.translate_files import open_translator, resolve_options  # noqa: E402


def main():
    model, source, count, beam, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    options = resolve_options([model], {"beam_size": beam}, device="cpu", engine="torch", threads=1, dtype=dtype,
                              workers=1)
    translator = open_translator([model], options, get_console(-1))
    with open(source, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for _, line in zip(range(count), handle)]
    translator.translate(lines)  # warm-up
    flops, seconds, started = [0], [0.0], [0.0]

    def start(module, inputs):
        started[0] = time.perf_counter()

    def count(module, inputs, output):
        seconds[0] += time.perf_counter() - started[0]
        flops[0] += 2 * inputs[0].numel() // module.in_features * module.in_features * module.out_features

    layers = [m for m in translator.engine.model.modules() if isinstance(m, (PackedLinear, Int8Linear))] \
        if hasattr(translator, "engine") else []
    if not layers:
        raise SystemExit("no packed or int8 Linear layers found: this script reads TorchEngine's models")
    handles = [m.register_forward_pre_hook(start) for m in layers] + [m.register_forward_hook(count) for m in layers]
    begun = time.perf_counter()
    translator.translate(lines)
    hooked = time.perf_counter() - begun
    for handle in handles:
        handle.remove()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        translator.translate(lines)
        times.append(time.perf_counter() - start)
    print(f"load {os.getloadavg()}; {dtype}, beam {beam}, {len(lines)} lines, one thread: {len(layers)} Linear layers, "
          f"{flops[0] / 1e9:.1f} GFLOP of products per search; search {min(times):.2f} s (best of 3: "
          f"{', '.join(f'{t:.2f}' for t in times)}), {len(lines) / min(times):.1f} sentences/s")
    print(f"with the hooks: search {hooked:.2f} s, of which the Linear calls {seconds[0]:.2f} s "
          f"({100 * seconds[0] / hooked:.0f}%, {flops[0] / seconds[0] / 1e9:.1f} GFLOP/s on average); the same "
          f"products at 65 GFLOP/s would take {flops[0] / 65e9:.2f} s")


if __name__ == "__main__":
    main()
