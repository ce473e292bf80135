"""The cost of one decoder step against its rows: translate LINES lines of SOURCE as ``nmtkit
translate`` does (one thread, one batch at a time), timing every ``decode_step`` call and the
search's work between calls, then fitting step time = a + b * rows + c * rows * t (t: the step's
index in its batch, the self-attention cache's length).

    python benchmarks/results/zen3_ceiling/steps.py MODEL_DIR SOURCE LINES BEAM DTYPE
"""
import os
import sys
import time

import numpy as np

from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

keep_freed_memory()  # as the CLI does, before torch loads
bound_kernel_caches()
from nmtkit.runtime.console import get_console  # noqa: E402
from nmtkit.translate_files import open_translator, resolve_options  # noqa: E402


def main():
    model_dir, source, count, beam, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    options = resolve_options([model_dir], {"beam_size": beam}, device="cpu", engine="torch", threads=1,
                              dtype=dtype, workers=1)
    translator = open_translator([model_dir], options, get_console(-1))
    with open(source, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for _, line in zip(range(count), handle)]
    model = translator.engine.model
    decode_step, calls = model.decode_step, []

    def timed(prev, enc, state, need_attn):
        start = time.perf_counter()
        out = decode_step(prev, enc, state, need_attn)
        calls.append((prev.numel(), getattr(state, "step", 0), start, time.perf_counter() - start))
        return out

    translator.translate(lines)  # warm-up
    model.decode_step = timed
    start = time.perf_counter()
    translator.translate(lines)
    wall = time.perf_counter() - start
    rows, t, begun, took = (np.array(column, dtype=float) for column in zip(*calls))
    between = np.diff(begun) - took[:-1]
    between = between[np.diff(t) > 0]  # steps of one batch; a new batch's gap holds its encoder
    fit, *_ = np.linalg.lstsq(np.stack([np.ones_like(rows), rows, rows * t], 1), took, rcond=None)
    few = took[rows <= 2 * beam]
    print(f"load {os.getloadavg()}; {dtype}, beam {beam}, {len(lines)} lines, one thread, one batch at a time")
    print(f"search {wall:.2f} s; {len(calls)} steps, rows per step mean {rows.mean():.1f}, median {np.median(rows):.0f}, "
          f"max {rows.max():.0f}")
    print(f"decode_step {took.sum():.2f} s in all; between steps (the search's own work) {between.sum():.2f} s, "
          f"{1000 * between.mean():.2f} ms a step")
    print(f"fit: step ms = {1000 * fit[0]:.2f} + {1000 * fit[1]:.4f} * rows + {1000 * fit[2]:.5f} * rows * t; "
          f"over the search: {fit[0] * len(took):.2f} s fixed, {fit[1] * rows.sum():.2f} s by rows, "
          f"{fit[2] * (rows * t).sum():.2f} s by rows * t")
    print(f"steps with at most {2 * beam} rows (two sentences or fewer): {len(few)}, {1000 * few.mean():.2f} ms each, "
          f"{few.sum():.2f} s in all")


if __name__ == "__main__":
    main()
