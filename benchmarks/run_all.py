"""Run every benchmark on one model and its prepared data; JSON and Markdown land in --out,
and summary.md puts the tables together.

    python benchmarks/run_all.py --model data/quickstart/train/averaged --data data/quickstart/prepared

Peers run where installed: CTranslate2 on our exported model (pip install 'nmtkit[ct2]')
and HuggingFace MarianMT with random weights of the same dims (pip install transformers).
Timings share the machine with whatever else runs: each figure records the load average.
"""
from __future__ import annotations

import sys
from pathlib import Path

import common
import decode_speed
import startup
import train_speed


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", default="train,decode,startup", help="comma-separated subset to run")
    parser.add_argument("--train-dtypes", default="float32,bf16", help="dtypes of the training run")
    parser.add_argument("--train-steps", type=int, default=40, help="updates per training dtype")
    parser.add_argument("--max-sentences", type=int, default=0, help="decode the first N test lines (0: all)")
    parser.add_argument("--configs", default=decode_speed.NATURAL, help="decoding engine:dtype:beam list")
    parser.add_argument("--forced-configs", default=decode_speed.FORCED, help="forced-length engine:dtype:beam list")
    args, rest = parser.parse_known_args()
    shared = ["--model", args.model, "--data", args.data, "--out", args.out, "--threads", str(args.threads),
              "--device", args.device]
    only = set(args.only.split(","))
    if "train" in only:
        train_speed.main([*shared, "--dtypes", args.train_dtypes, "--steps", str(args.train_steps), *rest])
    if "decode" in only:
        decode_speed.main([*shared, "--max-sentences", str(args.max_sentences), "--configs", args.configs,
                           "--forced-configs", args.forced_configs])
    if "startup" in only:
        startup.main(shared)
    out = Path(args.out)
    parts = [out / f"{name}.md" for name in ("train_speed", "decode_speed", "startup") if (out / f"{name}.md").is_file()]
    summary = out / "summary.md"
    summary.write_text("# nmtkit benchmarks\n\nCommand: `python " + " ".join(sys.argv) + "`\n\n"
                       + "\n".join(p.read_text(encoding="utf-8") for p in parts), encoding="utf-8")
    print(f"wrote {summary}", file=sys.stderr)


if __name__ == "__main__":
    main()
