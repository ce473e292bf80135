"""Multi-process training through torch.distributed, launched by ``torchrun``.

Every rank builds the same batch list from (seed, epoch); an update of
``update_freq * world_size`` micro-batches gives rank r the slice
``[r * update_freq, (r + 1) * update_freq)``. So one process with update_freq k*n sees
exactly the batches that n processes with update_freq k see together, and resume needs
only the shared data position. Without ``torchrun`` (WORLD_SIZE unset) all of this is a
no-op.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as torch_dist


def world_size() -> int:
    return torch_dist.get_world_size() if torch_dist.is_initialized() else 1


def rank() -> int:
    return torch_dist.get_rank() if torch_dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def init() -> None:
    """Join the process group when launched by torchrun (gloo on CPU, NCCL on GPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch_dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch_dist.init_process_group(backend=backend)


def device_for_rank(device: torch.device) -> torch.device:
    if device.type == "cuda" and torch_dist.is_initialized():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return device


def barrier() -> None:
    if torch_dist.is_initialized():
        torch_dist.barrier()


def my_share(group: list, update_freq: int) -> list:
    """This rank's micro-batches of one update's ``update_freq * world_size`` batches."""
    start = rank() * update_freq
    return group[start:start + update_freq]


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel around ``model`` when running under torchrun."""
    if not torch_dist.is_initialized():
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def no_sync_unless(model: torch.nn.Module, final: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an update."""
    if final or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()
