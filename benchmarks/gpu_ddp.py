"""torchrun entry point of gpu_check.py: joins an NCCL process group even when torchrun starts a
single process (nmtkit itself skips the group then), so one GPU exercises DDP and NCCL.

    torchrun --standalone --nproc_per_node 1 benchmarks/gpu_ddp.py RECIPE [overrides]

(gloo where there is no GPU, to try it out on a CPU)
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as torch_dist

from nmtkit.config import load_config
from nmtkit.runtime.console import get_console
from nmtkit.training import trainer


def main(recipe: str, *overrides: str) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch_dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")  # gloo: trying it on CPU
    try:
        trainer.train(load_config(recipe, list(overrides)), get_console(0))
    finally:
        torch_dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
