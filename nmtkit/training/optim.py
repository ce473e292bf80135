"""The optimizer; its learning rate per step comes from ``schedule.py``."""
from __future__ import annotations

import torch

from nmtkit.config import Config


def make_optimizer(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """Adam with the paper's betas/eps; fused kernels on CUDA, foreach on CPU."""
    kwargs = dict(lr=0.0, betas=tuple(cfg.train.betas), eps=cfg.train.eps, weight_decay=cfg.train.weight_decay)
    if device.type == "cuda":
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = True
    cls = torch.optim.AdamW if cfg.train.weight_decay > 0 else torch.optim.Adam
    return cls(model.parameters(), **kwargs)
