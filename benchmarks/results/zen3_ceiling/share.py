"""What a search's Linear products would cost at a given rate, against the search's wall time:
translate LINES lines (the first of SOURCE) as ``nmtkit translate`` does (one thread, one batch
at a time), counting every Linear product's multiply-adds with forward hooks, then the same
search timed without hooks.

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
    flops = [0]

    def count_flops(module, inputs, output):
        flops[0] += 2 * inputs[0].numel() // module.in_features * module.in_features * module.out_features

    layers = [m for m in translator.engine.model.modules() if isinstance(m, (PackedLinear, Int8Linear))] \
        if hasattr(translator, "engine") else []
    if not layers:
        raise SystemExit("no packed or int8 Linear layers found: this script reads TorchEngine's models")
    handles = [m.register_forward_hook(count_flops) for m in layers]
    translator.translate(lines)
    for handle in handles:
        handle.remove()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        translator.translate(lines)
        times.append(time.perf_counter() - start)
    print(f"load {os.getloadavg()}; {dtype}, beam {beam}, {len(lines)} lines, one thread: {len(layers)} Linear layers, "
          f"{flops[0] / 1e9:.1f} GFLOP of products per search; search {min(times):.2f} s (best of 3: "
          f"{', '.join(f'{t:.2f}' for t in times)}), {len(lines) / min(times):.1f} sentences/s; the products alone "
          f"at 60 / 65 / 70 GFLOP/s: {flops[0] / 60e9:.2f} / {flops[0] / 65e9:.2f} / {flops[0] / 70e9:.2f} s")


if __name__ == "__main__":
    main()
