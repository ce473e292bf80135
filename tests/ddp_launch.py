"""Test-only torchrun entry point: train a recipe as `nmtkit train` does, then save the
weights this process ended with, which the package never exposes (only rank 0 writes).

    torchrun --nproc_per_node 2 tests/ddp_launch.py RECIPE OUT_DIR   -> OUT_DIR/rank{r}.safetensors
"""
from __future__ import annotations

import sys
from pathlib import Path

from safetensors.torch import save_file

from nmtkit.config import load_config
from nmtkit.modeldir import state_dict_for_save
from nmtkit.runtime.console import get_console
from nmtkit.training import distributed as dist
from nmtkit.training import trainer


def main(recipe: str, out_dir: str) -> None:
    final = {}
    run = trainer.Trainer.run

    def run_and_keep(self):  # still inside the process group, which train() leaves on return
        result = run(self)
        final["rank"] = dist.rank()
        final["weights"] = state_dict_for_save(self.model)  # keyed as in checkpoints
        return result

    trainer.Trainer.run = run_and_keep
    trainer.train(load_config(recipe), get_console(-1))
    save_file(final["weights"], str(Path(out_dir) / f"rank{final['rank']}.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:])
