"""int8 products on one thread, fbgemm's (as Int8Linear runs them, the input already scaled row by
row) against oneDNN's qlinear on the same int8 weights, and what quantising the rows to uint8 costs
in PyTorch first (oneDNN's op takes uint8 input; fbgemm's quantises inside). Same shapes as a
quickstart-size decoder step at 280 rows, the output layer also at 70, and 4 rows.

    python benchmarks/results/zen3_ceiling/int8_kernels.py
"""
import os

import torch
from torch import nn

from nmtkit.models.quantize import STEPS, ZERO_POINT, Int8Linear, _int8_product
from products import best_us  # this script's folder is on sys.path


def main():
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()}")
    print("| rows x in x out | fbgemm µs | oneDNN µs | quantise to uint8 µs | same result |")
    print("|---|---|---|---|---|")
    for rows, n_in, n_out in ((280, 256, 256), (280, 256, 768), (280, 256, 1024), (280, 1024, 256),
                              (280, 256, 8000), (70, 256, 8000), (4, 256, 256)):
        torch.manual_seed(0)
        linear, x = nn.Linear(n_in, n_out), torch.randn(rows, n_in)
        weight = linear.weight.detach()
        scales = (weight.abs().amax(1) / 127).float()
        qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        packed = torch.ops.onednn.qlinear_prepack(qweight, [rows, n_in])
        zeros = torch.zeros(n_out, dtype=torch.long)
        peak = x.abs().amax(1, keepdim=True)
        scaled = x / peak

        def quantise():
            return scaled.mul(STEPS).round_().add_(ZERO_POINT).to(torch.int16).to(torch.uint8)

        rows_u8 = quantise()

        def onednn():
            return torch.ops.onednn.qlinear_pointwise(rows_u8, 1.0 / STEPS, ZERO_POINT, packed, scales, zeros, None,
                                                      1.0, 0, torch.float32, "none", [], "")

        fb = Int8Linear(linear)
        same = torch.equal(onednn() * peak, _int8_product(scaled, fb.packed) * peak)
        print(f"| {rows} x {n_in} x {n_out} | {best_us(lambda: _int8_product(scaled, fb.packed), 20, 3):.0f} | "
              f"{best_us(onednn, 20, 3):.0f} | {best_us(quantise, 20, 3):.0f} | {same} |")


if __name__ == "__main__":
    main()
