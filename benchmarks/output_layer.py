"""The output layer + label-smoothed loss of one training step: the whole [tokens, V] logits at
once (the path before chunking) against training's chunked path, forward and backward of a
Transformer, each path in its own child process (so its peak RSS is its own), median step time.

    python benchmarks/output_layer.py --vocab 37000 --d-model 512 --batch 256 --length 32 --dtype bf16
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import common


def step_times(path: str, args) -> dict:
    """Runs in the child: ``args.steps`` timed forward + backward passes of ``path`` (whole | chunked)."""
    import torch

    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model
    from nmtkit.specials import BOS, PAD
    from nmtkit.training.loss import TrainingLoss, label_smoothed_loss

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    d = args.d_model
    model = build_model(ModelConfig(d_model=d, ffn_dim=4 * d, heads=8, encoder_layers=args.layers,
                                    decoder_layers=args.layers, dropout=0.0), args.vocab, args.vocab)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, args.vocab, (args.batch, args.length), generator=g)
    tgt_out = torch.randint(4, args.vocab, (args.batch, args.length), generator=g)
    padding = torch.arange(args.length)[None] >= torch.randint(args.length // 2, args.length + 1, (args.batch, 1),
                                                               generator=g)
    src[padding], tgt_out[padding] = PAD, PAD
    tgt_in = torch.cat([torch.full((args.batch, 1), BOS), tgt_out[:, :-1]], 1).masked_fill(padding, PAD)
    objective = TrainingLoss(model, 0.1)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def step() -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            if path == "whole":
                loss, _ = label_smoothed_loss(model(src, src.ne(PAD), tgt_in), tgt_out, 0.1)
            else:
                loss, _ = objective(src, src.ne(PAD), tgt_in, tgt_out)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    step()  # warm-up
    times = sorted(step() for _ in range(args.steps))
    return {"path": path, "step_ms": round(1000 * times[len(times) // 2], 1)}


def main(argv=None) -> list[dict]:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=1, help="encoder and decoder layers")
    parser.add_argument("--batch", type=int, default=256, help="sentences per batch")
    parser.add_argument("--length", type=int, default=32, help="longest sentence (lengths drawn from half of it up)")
    parser.add_argument("--dtype", choices=("float32", "bf16"), default="float32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=("whole", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(common.REPO / "benchmarks" / "out"), help="where JSON and Markdown go")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(step_times(args.child, args)))
        return []
    given = sys.argv[1:] if argv is None else list(argv)
    records = []
    for path in ("whole", "chunked"):
        child = common.run_child([common.python(), __file__, *given, "--child", path], threads=args.threads)
        if child["returncode"]:
            raise RuntimeError(child["stderr"][-2000:])
        records.append({**common.last_json_line(child["stdout"]), "peak_rss_mib": child["peak_rss_mib"],
                        "load_avg": common.load_average()})
        print(json.dumps(records[-1]), flush=True)
    columns = [("path", "path"), ("step_ms", "forward + backward ms"), ("peak_rss_mib", "peak RSS MiB")]
    common.write_results(Path(args.out), "output_layer", records, columns, "Output layer + loss, whole vs chunked",
                         [f"Command: python benchmarks/output_layer.py {' '.join(given)}"])
    return records


if __name__ == "__main__":
    main()
