"""Multi-process training through torch.distributed, launched by ``torchrun``.

Every rank builds the same batch list from (seed, epoch); an update of
``update_freq * world_size`` micro-batches gives rank r the slice
``[r * update_freq, (r + 1) * update_freq)``, and each micro-batch draws its dropout from
(seed, update, position in the update). So one process with update_freq k*n computes the
same update as n processes with update_freq k, and resume needs only the shared data
position. Rank 0 alone prints, validates and writes; the others wait for it in a
collective. Without ``torchrun`` (WORLD_SIZE unset or 1) every function here is a no-op.
"""
from __future__ import annotations

import contextlib
import datetime
import os

import numpy as np
import torch
import torch.distributed as torch_dist

from nmtkit.errors import ConfigError, NmtkitError

# How long ranks wait at a collective, e.g. for rank 0's validation and checkpoint (NCCL's default is 10 min).
TIMEOUT = datetime.timedelta(minutes=30)


def world_size() -> int:
    return torch_dist.get_world_size() if torch_dist.is_initialized() else 1


def rank() -> int:
    return torch_dist.get_rank() if torch_dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


@contextlib.contextmanager
def process_group(device: torch.device):
    """Join the torchrun process group (NCCL for CUDA, gloo for CPU) and yield this rank's device.

    The group is left on success and on SystemExit (a signal stop, reached by all ranks
    together); after any other error the process just exits and torchrun stops the rest.
    """
    joined = torch_dist.is_initialized()  # by the caller, who also leaves (even a group of one process)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not joined:
        yield device
        return
    if device.type == "cuda":  # one GPU per process, whatever train.device names (DDP needs its index)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if joined:
        yield device
        return
    torch_dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
    try:
        yield device
    except SystemExit:
        torch_dist.destroy_process_group()
        raise
    torch_dist.destroy_process_group()


def rank_console(console):
    """``console`` on rank 0; a silent one elsewhere, so N processes print one log."""
    if is_main():
        return console
    from nmtkit.runtime.console import get_console

    quiet = get_console(console.verbosity)
    quiet.quiet = True
    return quiet


def local_update_freq(train_cfg) -> int:
    """Micro-batches this process accumulates per update.

    ``train.update_freq`` counts per process; ``train.batches_per_update`` (when > 0)
    fixes the count over all processes, so the update is the same on 1 or 64 GPUs.
    """
    total = train_cfg.batches_per_update
    if total == 0:
        return train_cfg.update_freq
    if total < 0:
        raise ConfigError(f"train.batches_per_update must be 0 (off) or positive, got {total}")
    if train_cfg.update_freq != 1:
        raise ConfigError(f"set train.update_freq ({train_cfg.update_freq}) or train.batches_per_update ({total}), "
                          f"not both")
    if total % world_size():
        raise ConfigError(f"train.batches_per_update={total} is not divisible by the {world_size()} processes; "
                          f"use a multiple of {world_size()}")
    return total // world_size()


def update_change(train_cfg, recorded: int) -> str:
    """What a resume on another number of processes than the run's ``recorded`` one (0: an older
    checkpoint, which did not say) does to the update: with train.update_freq, which counts per
    process, it holds more or fewer batches; "" when nothing changes (batches_per_update fixes
    the count over all processes)."""
    now = world_size()
    if not recorded or recorded == now or train_cfg.batches_per_update:
        return ""
    per = train_cfg.update_freq
    return (f"resumed on {now} process(es) where this run trained on {recorded}: train.update_freq={per} counts per "
            f"process, so an update is now {per * now} batch(es) of up to {train_cfg.max_tokens} tokens instead of "
            f"{per * recorded} (train.batches_per_update fixes the count over all processes)")


def my_share(group: list, update_freq: int) -> list:
    """This rank's micro-batches of one update's ``update_freq * world_size`` batches."""
    start = rank() * update_freq
    return group[start:start + update_freq]


def seed_micro_batch(seed: int, step: int, index: int, device: torch.device) -> None:
    """Seed dropout from (seed, update, index of the micro-batch within the update), so it
    does not depend on which process runs the micro-batch or on what ran before."""
    # shifted as a Python int: numpy 1.x refuses uint64 >> int (same value under numpy 2)
    value = int(np.random.SeedSequence([seed, step, index]).generate_state(1, np.uint64)[0]) >> 1
    torch.random.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.manual_seed(value)  # this process's GPU only


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


def barrier() -> None:
    if torch_dist.is_initialized():
        if torch_dist.get_backend() == "nccl":
            torch_dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            torch_dist.barrier()


def from_main(value):
    """Rank 0's ``value`` on every rank (any picklable object); waits for rank 0."""
    if not torch_dist.is_initialized():
        return value
    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def require_same(value, what: str) -> None:
    """Raise on every rank unless all ranks hold the same ``value``."""
    if not torch_dist.is_initialized():
        return
    values = [None] * world_size()
    torch_dist.all_gather_object(values, value)
    if any(v != values[0] for v in values):
        raise NmtkitError(f"the {world_size()} processes disagree on {what}: {values}")


def gather(value) -> list:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    if not torch_dist.is_initialized():
        return [value]
    values = [None] * world_size()
    torch_dist.all_gather_object(values, value)
    return values


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over all ranks (a new tensor)."""
    tensor = tensor.clone()
    if torch_dist.is_initialized():
        torch_dist.all_reduce(tensor)
    return tensor


def agree_to_stop(stop: bool, seconds: float, device: torch.device) -> tuple[bool, float]:
    """(any rank asked to stop, the slowest rank's training clock): ranks receive signals
    and read clocks at different moments, yet must leave the loop at the same update."""
    if not torch_dist.is_initialized():
        return stop, seconds
    flags = torch.tensor([float(stop), seconds], dtype=torch.float64, device=device)
    torch_dist.all_reduce(flags, op=torch_dist.ReduceOp.MAX)
    stop_any, slowest = flags.tolist()
    return bool(stop_any), slowest
