"""Resident memory after each batch of decoding, in one process: does it level off or grow?

Translates the first ``--batches`` x ``--batch-lines`` lines of a prepared split in batches of
``--batch-lines`` with nmtkit's own search, and prints the RSS after each batch, then where the
memory lies (``/proc/self/smaps``: the malloc heap, other anonymous memory, executable anonymous
memory, i.e. JIT-compiled code). With the CLI's start-up settings (glibc tuning, kernel cache
bounds) unless ``--untuned``; a cache variable set in the environment is kept, so

    LRU_CACHE_CAPACITY=1024 ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 python benchmarks/decode_memory.py \
        --model WORKDIR/train/averaged --data WORKDIR/prepared --dtype bf16

shows what oneDNN's and ideep's default capacities do (docs/performance.md, "Memory in bf16").
"""
from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2 ** 20


def memory_by_kind() -> dict[str, float]:
    """MiB resident per kind of mapping: ``heap``, ``anon`` (other anonymous read-write),
    ``jit code`` (anonymous and executable), ``files``."""
    kinds: collections.Counter = collections.Counter()
    kind = "files"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            name = fields[5] if len(fields) > 5 else ""
            kind = ("heap" if name == "[heap]" else "files" if name.startswith("/") else
                    "jit code" if not name and "x" in fields[1] else "anon")
        elif fields[0] == "Rss:":
            kinds[kind] += int(fields[1]) / 1024
    return {kind: round(mib) for kind, mib in kinds.items()}


def main(argv=None) -> dict:
    """The RSS after each batch (MiB) and the resident memory by kind at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="nmtkit model directory")
    parser.add_argument("--data", required=True, help="prepared directory (WORKDIR/prepared)")
    parser.add_argument("--split", default="dev", help="prepared split to translate")
    parser.add_argument("--dtype", default="bf16", help="float32 or bf16")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--batch-lines", type=int, default=40)
    parser.add_argument("--untuned", action="store_true", help="without the CLI's start-up settings")
    args = parser.parse_args(argv)
    if not args.untuned:
        from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

        keep_freed_memory()  # as the nmtkit CLI does, before torch loads
        bound_kernel_caches()
    import torch

    from nmtkit.decoding.torch_engine import TorchEngine, load_models
    from nmtkit.decoding.translate import TranslateOptions, Translator

    torch.set_num_threads(1)
    meta = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    lines = (Path(args.data) / f"{args.split}.{meta['src_lang']}").read_text(encoding="utf-8").splitlines()
    options = TranslateOptions(beam_size=args.beam, dtype=args.dtype)
    translator = Translator(TorchEngine.from_loaded(load_models([args.model], torch.device("cpu")), options),
                            options)
    print(f"loaded: {rss_mib():.0f} MiB")
    after = []
    for batch in range(args.batches):
        translator.translate(lines[batch * args.batch_lines:(batch + 1) * args.batch_lines])
        after.append(round(rss_mib(), 1))
        print(f"after batch {batch + 1}: {after[-1]:.0f} MiB", flush=True)
    kinds = memory_by_kind()
    print("resident by kind (MiB):", kinds)
    return {"rss_after_batches_mib": after, "resident_by_kind_mib": kinds}


if __name__ == "__main__":
    main()
