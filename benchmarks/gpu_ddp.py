"""torchrun entry point of gpu_check.py: joins an NCCL process group even when torchrun starts a
single process (nmtkit itself skips the group then), so one GPU exercises DDP and NCCL.

    torchrun --standalone --nproc_per_node 1 benchmarks/gpu_ddp.py RECIPE [overrides]

(gloo where there is no GPU, to try it out on a CPU)
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

LAUNCHER = os.getppid()  # torchrun, read before the seconds of imports below

import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402

from nmtkit.config import load_config  # noqa: E402
from nmtkit.runtime.console import get_console  # noqa: E402
from nmtkit.training import trainer  # noqa: E402


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when torchrun dies. torchrun starts each worker in a
    session of its own, so a worker whose torchrun was killed (the part's time limit) would
    otherwise live on, holding the GPU through the parts that follow. (Linux only: elsewhere
    there is no prctl, and gpu_check.py's sweep of marked processes is left to stop it.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != LAUNCHER:  # torchrun died while this process was importing: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


def main(recipe: str, *overrides: str) -> None:
    die_with_parent()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch_dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")  # gloo: trying it on CPU
    try:
        trainer.train(load_config(recipe, list(overrides)), get_console(0))
    finally:
        torch_dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
