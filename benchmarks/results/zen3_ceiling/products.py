"""How close a decoding step's matrix products run to this CPU's peak, one thread: each Linear
shape of a quickstart-size model's decoder step (d, ffn, vocab from the model's config; ROWS
rows, e.g. 70 sentences x beam 4) as translation runs it (PackedLinear in float32; Int8Linear
in int8, its row scaling included, and fbgemm's product alone), against the best square float32
matmul on one thread (benchmarks/common.py's matmul_peak); then every product of one decoder step
(each decoder layer's six, then the output layer, each with weights of its own, as a step reads
them) at a few row counts.

    python benchmarks/results/zen3_ceiling/products.py MODEL_DIR [ROWS]
"""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for common
import common  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from torch import nn  # noqa: E402

from nmtkit.models.prepack import PackedLinear  # noqa: E402
from nmtkit.models.quantize import Int8Linear, _int8_product  # noqa: E402


def best_us(fn, repeat=30, rounds=5):
    fn(), fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def main():
    model, rows = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 280
    cfg = json.loads((model / "config.json").read_text())["model"]
    with safe_open(str(model / "model.safetensors"), "pt") as weights:
        name = "tgt_embed.weight" if "tgt_embed.weight" in weights.keys() else "src_embed.weight"  # tied: one table
        vocab = weights.get_slice(name).get_shape()[0]
    d, ffn = cfg["d_model"], cfg["ffn_dim"]
    torch.set_num_threads(1)
    peak = common.matmul_peak("float32", 1)["measured_one_thread"]
    shapes = {"self q, k, v": (d, 3 * d), "attention out / cross q": (d, d), "ffn in": (d, ffn),
              "ffn out": (ffn, d), "output layer": (d, vocab)}
    print(f"load {os.getloadavg()}; one-thread float32 peak (square 1024/2048 matmul) {peak:.1f} GFLOP/s; rows {rows}")
    print("| product | in x out | float32 packed GFLOP/s (% of peak) | int8 whole | int8 product alone |")
    print("|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, (n_in, n_out) in shapes.items():
            linear = nn.Linear(n_in, n_out)
            x = torch.randn(rows, n_in, generator=gen)
            flops = 2 * rows * n_in * n_out
            packed, int8 = PackedLinear(linear), Int8Linear(linear)
            scaled = x / x.abs().amax(1, keepdim=True)
            rate = {key: flops / best_us(fn) / 1e3 for key, fn in
                    (("f32", lambda: packed(x)), ("int8", lambda: int8(x)),
                     ("prod", lambda: _int8_product(scaled, int8.packed)))}
            print(f"| {name} | {n_in} x {n_out} | {rate['f32']:.1f} ({100 * rate['f32'] / peak:.0f}%) "
                  f"| {rate['int8']:.1f} | {rate['prod']:.1f} |")
        step = [shapes[key] for key in ("self q, k, v", "attention out / cross q", "attention out / cross q",
                                        "attention out / cross q", "ffn in", "ffn out")] * cfg["decoder_layers"]
        step.append(shapes["output layer"])
        plain = [nn.Linear(n_in, n_out) for n_in, n_out in step]
        kinds = {"float32 packed": [PackedLinear(m) for m in plain], "int8": [Int8Linear(m) for m in plain]}
        megabytes = sum(n_in * n_out for n_in, n_out in step) * 4 / 2 ** 20
        print(f"\nOne decoder step's {len(step)} products in turn ({megabytes:.1f} MiB of float32 weights):")
        print("| rows | " + " | ".join(f"{k} ms (GFLOP/s)" for k in kinds) + " |")
        print("|---" * (len(kinds) + 1) + "|")
        for count in (1, 4, 8, 16, 40, 100, 280):
            inputs = {n_in: torch.randn(count, n_in, generator=gen) for n_in, _ in step}
            flops = sum(2 * count * n_in * n_out for n_in, n_out in step)
            cells = []
            for layers in kinds.values():
                took = best_us(lambda: [layer(inputs[n_in]) for layer, (n_in, _) in zip(layers, step)], repeat=10) / 1e3
                cells.append(f"{took:.2f} ({flops / took / 1e6:.1f})")
            print(f"| {count} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
