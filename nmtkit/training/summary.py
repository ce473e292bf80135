"""What a training run is about to do, as a table: ``nmtkit train --dry-run`` (``print_dry_run``)
and the start of every run."""
from __future__ import annotations

from typing import Optional

from nmtkit.config import Config
from nmtkit.errors import DataError
from nmtkit.models.build import build_model, parameter_table
from nmtkit.training import distributed as dist
from nmtkit.workdir import WorkDir


def print_summary(console, model, cfg: Config, vocab_sizes: tuple[int, int], device, dtype,
                  always: bool = False, init: Optional[dict] = None) -> dict:
    """The --dry-run table: parameters by part, dims, the effective batch and, for a fine-tuning
    run, the model it starts from (``init``: the record of training/init_from.py)."""
    from rich.table import Table

    counts = parameter_table(model)
    world = dist.world_size()
    table = Table(title=f"{cfg.name}: {cfg.model.arch}", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for part in ("embeddings", "encoder", "decoder", "other", "total"):
        if counts[part] or part == "total":
            table.add_row(f"parameters: {part}", f"{counts[part]:,}")
    active = model.active_parameters()
    table.add_row("parameters: active per token", f"{active:,}")
    m = cfg.model
    if m.arch == "transformer":
        key_size = f" (d_k {m.key_dim})" if m.key_dim else ""
        moe = f", MoE {m.moe_experts} experts top-{m.moe_top_k} every {m.moe_every}" if m.moe_experts else ""
        dims = (f"d {m.d_model}, ffn {m.ffn_dim} ({m.ffn}), heads {m.heads}{key_size}, "
                f"layers {m.encoder_layers}+{m.decoder_layers}, {m.positions} positions{moe}")
    else:
        dims = f"{m.cell} embed {m.embed_dim}, hidden {m.hidden_dim}, attention {m.attention}"
    table.add_row("dims", dims)
    table.add_row("vocab (src / tgt)", f"{vocab_sizes[0]} / {vocab_sizes[1]}")
    update_freq = dist.local_update_freq(cfg.train)
    effective = cfg.train.max_tokens * update_freq * world
    table.add_row("effective batch (tokens)",
                  f"{effective:,} = {cfg.train.max_tokens:,} x {update_freq} x {world} process(es)")
    table.add_row("device / dtype", f"{device} / {str(dtype).replace('torch.', '')}")
    if init is not None:
        table.add_row("starts from (train.init_from)", f"{init['path']} (step {init.get('step')})")
    (console.print if always else console.info)(table)  # information before training (-q hides it);
    # the answer itself for --dry-run (always)
    return {**counts, "active": active, "effective_batch_tokens": effective}


def print_dry_run(cfg: Config, console, device, dtype) -> None:
    """``nmtkit train --dry-run``: the table, before `prepare` too (vocab.size stands in for the
    SentencePiece models). A train.init_from model is checked against the recipe (and the
    prepared vocabulary, if any)."""
    from nmtkit.training.init_from import check_vocabulary, init_source
    from nmtkit.training.startup import prepared_vocabs

    init = init_source(cfg)
    try:
        src_path, tgt_path, src_vocab, tgt_vocab = prepared_vocabs(cfg)
    except DataError as err:
        sizes = (cfg.vocab.size, cfg.vocab.size)
        if WorkDir.of(cfg).prepared.is_dir():  # there, but refused: the real run would stop here
            console.warn(f"{err} (the counts below use vocab.size)")
    else:
        sizes = (len(src_vocab), len(tgt_vocab))
        if init is not None:
            check_vocabulary(init, src_path, tgt_path)
    if dist.is_main():
        import torch

        with torch.device("meta"):  # counts and dims only: no memory, even for a model too big for this machine
            model = build_model(cfg.model, *sizes)
        print_summary(console, model, cfg, sizes, device, dtype, always=True,
                      init=init.record() if init is not None else None)
