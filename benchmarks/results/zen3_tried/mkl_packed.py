"""MKL's packed float32 product (``torch.ops.mkl._mkl_linear``, the weights packed once for a row
count given in advance) against oneDNN's packed product that translation uses
(``nmtkit/models/prepack.py``): one decoder step's 19 products of the quickstart shapes (d 256,
FFN 1,024, 8,000 pieces, 3 decoder layers), each with weights of its own, one thread, best of 7;
then whether each row's result is the same bit for bit when the rows are multiplied all 280 at
once, alone, in sevens and in 105s.

    python benchmarks/results/zen3_tried/mkl_packed.py
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zen3_ceiling"))  # products.py's timer
from products import best_us  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from nmtkit.models.prepack import PackedLinear  # noqa: E402


def best_ms(fn):
    return best_us(fn, repeat=10, rounds=7) / 1e3


class MklLinear:
    def __init__(self, linear, rows_hint):
        self.weight, self.bias, self.hint = linear.weight.detach(), linear.bias.detach(), rows_hint
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows_hint)

    def __call__(self, x):
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.hint)


def main():
    torch.set_num_threads(1)
    d, ffn, vocab = 256, 1024, 8000
    step = [(d, 3 * d), (d, d), (d, d), (d, d), (d, ffn), (ffn, d)] * 3 + [(d, vocab)]
    gen = torch.Generator().manual_seed(0)
    plain = [nn.Linear(n_in, n_out) for n_in, n_out in step]
    onednn = [PackedLinear(m) for m in plain]
    print(f"load {os.getloadavg()}; one thread; ms for one step's {len(step)} products (oneDNN / MKL)")
    with torch.inference_mode():
        for hint in (1, 64, 280):
            mkl = [MklLinear(m, hint) for m in plain]
            cells = []
            for rows in (1, 4, 16, 105, 280):
                xs = {n_in: torch.randn(rows, n_in, generator=gen) for n_in, _ in step}
                a = best_ms(lambda: [m(xs[n_in]) for m, (n_in, _) in zip(onednn, step)])
                b = best_ms(lambda: [m(xs[n_in]) for m, (n_in, _) in zip(mkl, step)])
                cells.append(f"{rows} rows {a:.2f} / {b:.2f} (MKL {a / b:.2f}x)")
            print(f"MKL packed for {hint} rows: " + "; ".join(cells))
            differ = {"oneDNN": 0, "MKL": 0}
            for (n_in, _), first, second in zip(step, onednn, mkl):
                x = torch.randn(280, n_in, generator=gen)
                for name, m in (("oneDNN", first), ("MKL", second)):
                    whole = m(x)
                    alone = torch.cat([m(x[r:r + 1]) for r in range(0, 280, 7)])
                    sevens = torch.cat([m(x[s:s + 7]) for s in range(0, 280, 7)])
                    thirds = torch.cat([m(x[s:s + 105]) for s in range(0, 280, 105)])
                    differ[name] += sum(not torch.equal(a, b) for a, b in
                                        ((whole[::7], alone), (whole, sevens), (whole, thirds)))
            print(f"  products whose rows differ from the 280-row batch (of {3 * len(step)}: {len(step)} shapes x "
                  f"alone, sevens, 105s): {differ}")


if __name__ == "__main__":
    main()
