"""Mixture-of-Experts bookkeeping in training: the router losses added to the loss, and the
per-layer statistics that go to metrics.jsonl.

Record fields (``train`` lines of an MoE model, over the logging window):
``moe_aux`` the load-balancing loss averaged over MoE layers (1 = uniform routing);
``moe_aux_layers`` {layer: that loss}; ``moe_load`` {layer: share of assignments per expert};
``moe_dropped`` assignments dropped by the capacity (0 when dropless); ``moe_z`` the router
z-loss when ``model.moe_z_weight`` > 0.
"""
from __future__ import annotations

from typing import Optional

import torch

from nmtkit.models.moe import RouterStats
from nmtkit.training import distributed as dist


def router_penalty(stats: list[RouterStats], aux_weight: float, z_weight: float) -> torch.Tensor:
    """Per-token penalty of one forward pass: each MoE layer's weighted losses, summed."""
    penalty = sum(aux_weight * s.aux_loss for s in stats)
    if z_weight > 0:
        penalty = penalty + sum(z_weight * s.z_loss for s in stats)
    return penalty


class RouterWindow:
    """Router statistics summed over the forward passes of a logging window, per layer."""

    def __init__(self, with_z: bool) -> None:
        self.with_z = with_z
        self.layers: list[str] = []
        self.sums: Optional[torch.Tensor] = None  # (layers, 4 + E): aux, z, dropped, passes, load per expert

    def add(self, stats: list[RouterStats]) -> None:
        rows = torch.stack([torch.cat([torch.stack([s.aux_loss.detach().float(), s.z_loss.detach().float(),
                                                    s.dropped.float(), torch.ones_like(s.z_loss, dtype=torch.float)]),
                                       s.load.float()]) for s in stats])
        if self.sums is None:
            self.layers, self.sums = [s.layer for s in stats], rows
        else:
            self.sums += rows

    def record(self) -> dict:
        """The window's metrics fields (summed over all processes); starts a new window."""
        if self.sums is None:
            return {}
        sums, self.sums = dist.sum_over_ranks(self.sums).tolist(), None
        aux = {layer: round(row[0] / max(row[3], 1), 4) for layer, row in zip(self.layers, sums)}
        record = {"moe_aux": round(sum(aux.values()) / len(aux), 4), "moe_aux_layers": aux,
                  "moe_load": {layer: [round(n / max(sum(row[4:]), 1), 4) for n in row[4:]]
                               for layer, row in zip(self.layers, sums)},
                  "moe_dropped": int(sum(row[2] for row in sums))}
        if self.with_z:
            record["moe_z"] = round(sum(row[1] / max(row[3], 1) for row in sums) / len(sums), 4)
        return record
