"""fairseq as a training peer of ``train_speed.py``: the same pieces, vocabulary, model and
optimiser, run by fairseq's own ``fairseq-preprocess`` and ``fairseq-train`` in another Python.

The pieces come from the prepared ids (``train.npz``, ``dev.npz``), so fairseq trains on
exactly the token sequences our trainer reads; its dictionary is our SentencePiece vocabulary
(control and unknown pieces left out: fairseq puts its own ``<s> <pad> </s> <unk>`` first),
so with a model that has those four both toolkits score the same V outputs per token.

fairseq's ``wps`` (logged per ``--log-interval`` updates under the ``train_inner`` tag) is
the sum of its batches' ``ntokens`` over the wall time since the previous log line;
``ntokens`` counts the target tokens with EOS and without padding: the same unit as our
``tgt_tok_s``. ``--num-workers 0`` keeps data loading in the training process, as ours, so
that one process's VmHWM is the whole run's peak RSS.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import common

# What fairseq's stock transformer can express of our model settings.
FAIRSEQ_MODEL = {"arch": "transformer", "ffn": "relu", "norm": "layernorm", "positions": "sinusoidal",
                 "moe_experts": 0}


def fairseq_dictionary(pieces: Sequence[str], reserved: Sequence[bool]) -> str:
    """fairseq's dict.txt for a SentencePiece vocabulary: one ``piece count`` line per piece
    not ``reserved`` (control and unknown pieces, which fairseq has as its own specials). The
    counts matter only when fairseq builds a dictionary itself; 1 keeps the format."""
    return "".join(f"{piece} 1\n" for piece, skip in zip(pieces, reserved) if not skip)


def fairseq_rates(log: str) -> list[float]:
    """The ``wps`` of every ``train_inner`` line of a ``--log-format json`` log, in order (the
    epoch summaries, tagged ``train``, average over the whole epoch and are left out)."""
    rates = []
    for line in log.splitlines():
        _, tag, payload = line.partition(" | train_inner | ")
        if tag:
            rates.append(float(json.loads(payload)["wps"]))
    return rates


def dictionary_size(log: str) -> dict:
    """The dictionary sizes fairseq-train reports per language (``[en] dictionary: 8000 types``),
    to check that it scores as many output pieces as we do."""
    return {lang: int(size) for lang, size in re.findall(r"\[([^\]]+)\] dictionary: (\d+) types", log)}


def write_pieces(ids, table, path: Path) -> None:
    """One line of space-separated pieces per sentence of ``ids`` (flat array + offsets)."""
    with open(path, "w", encoding="utf-8") as out:
        for start, end in zip(ids[1][:-1], ids[1][1:]):
            out.write(" ".join(table[ids[0][start:end]]) + "\n")


def write_text(data: Path, model_dir: Path, meta: dict, text_dir: Path) -> dict:
    """train/dev piece files ``{split}.{lang}`` and one dict per side in ``text_dir``: the
    fairseq-preprocess options that read them."""
    import numpy as np
    import sentencepiece

    from nmtkit.data.ids import load_split

    dicts = {}
    for side in ("src", "tgt"):
        sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / meta["spm"][side]))
        pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
        dicts[side] = text_dir / f"dict.{side}.txt"
        dicts[side].write_text(fairseq_dictionary(pieces, [sp.is_control(i) or sp.is_unknown(i)
                                                            for i in range(len(pieces))]), encoding="utf-8")
        table = np.array(pieces, dtype=object)
        for split in ("train", "dev"):
            ids = load_split(data / f"{split}.npz")
            write_pieces((getattr(ids, side), getattr(ids, f"{side}_offsets")), table,
                         text_dir / f"{split}.{meta[side + '_lang']}")
    joined = meta["spm"]["src"] == meta["spm"]["tgt"]
    return {"--joined-dictionary": joined, "--srcdict": dicts["src"], "--tgtdict": None if joined else dicts["tgt"]}


def preprocess_argv(meta: dict, text_dir: Path, dict_options: dict, bin_dir: Path) -> list[str]:
    argv = ["-m", "fairseq_cli.preprocess", "--source-lang", meta["src_lang"], "--target-lang", meta["tgt_lang"],
            "--trainpref", str(text_dir / "train"), "--validpref", str(text_dir / "dev"),
            "--destdir", str(bin_dir), "--workers", "1"]
    for option, value in dict_options.items():
        if value is True:
            argv.append(option)
        elif value:
            argv += [option, str(value)]
    return argv


def fairseq_train_argv(meta: dict, recipe: dict, bin_dir: Path, args) -> list[str]:
    """``fairseq-train`` options for our model's dimensions and our recipe's training settings:
    ``args.steps`` updates of ``--max-tokens`` (ours), logged every ``args.log_every``; one
    validation at the end and no checkpoints, as ``train_speed`` runs ours."""
    m, train = meta["model"], recipe.get("train", {})
    foreign = {key: m.get(key) for key, value in FAIRSEQ_MODEL.items() if m.get(key, value) != value}
    if foreign:
        raise SystemExit(f"fairseq peer: fairseq's transformer cannot train {foreign} (it needs {FAIRSEQ_MODEL})")
    tie = {"all": ["--share-all-embeddings"], "decoder": ["--share-decoder-input-output-embed"], "none": []}
    norm = ["--encoder-normalize-before", "--decoder-normalize-before"] if m.get("pre_norm") else []
    betas = train.get("betas", [0.9, 0.98])
    options = {
        "arch": "transformer", "encoder-layers": m["encoder_layers"], "decoder-layers": m["decoder_layers"],
        "encoder-embed-dim": m["d_model"], "decoder-embed-dim": m["d_model"],
        "encoder-ffn-embed-dim": m["ffn_dim"], "decoder-ffn-embed-dim": m["ffn_dim"],
        "encoder-attention-heads": m["heads"], "decoder-attention-heads": m["heads"],
        "dropout": m.get("dropout", 0.1), "attention-dropout": m.get("attention_dropout", 0.0),
        "activation-dropout": m.get("activation_dropout", 0.0), "activation-fn": "relu",
        "max-source-positions": m.get("max_positions", 512), "max-target-positions": m.get("max_positions", 512),
        "criterion": "label_smoothed_cross_entropy", "label-smoothing": train.get("label_smoothing", 0.1),
        "optimizer": "adam", "adam-betas": f"({betas[0]},{betas[1]})", "adam-eps": train.get("eps", 1e-9),
        "weight-decay": train.get("weight_decay", 0.0), "clip-norm": train.get("clip_norm", 0.0),
        "lr-scheduler": "inverse_sqrt", "lr": train.get("lr", 7e-4), "warmup-updates": train.get("warmup", 4000),
        "max-tokens": args.max_tokens or train.get("max_tokens", 4096), "update-freq": train.get("update_freq", 1),
        "max-update": args.steps, "seed": train.get("seed", 1), "num-workers": 0,
        "log-format": "json", "log-interval": args.log_every,
        "validate-interval": 10 ** 6, "save-dir": str(bin_dir / "checkpoints"),  # validated once, at the end
    }
    flags = ["--cpu", "--no-save", "--skip-invalid-size-inputs-valid-test",
             *tie[m.get("tie_embeddings", "all")], *norm]
    return ["-m", "fairseq_cli.train", str(bin_dir), "--task", "translation", "--source-lang", meta["src_lang"],
            "--target-lang", meta["tgt_lang"], *[x for key, value in options.items() for x in (f"--{key}", str(value))],
            *flags]


def binarize(args, meta: dict, scratch: Path) -> Path:
    """fairseq's binarised train/dev data in ``scratch``/bin, from our ids and vocabulary (untimed)."""
    text_dir, bin_dir = scratch / "text", scratch / "bin"
    text_dir.mkdir()
    dict_options = write_text(Path(args.data).resolve(), Path(args.model), meta, text_dir)
    done = common.run_child([args.peer_python, *preprocess_argv(meta, text_dir, dict_options, bin_dir)],
                            threads=args.threads, timeout=3600.0)
    if done["returncode"] != 0:
        raise RuntimeError(f"fairseq-preprocess failed:\n{(done['stdout'] + done['stderr'])[-3000:]}")
    return bin_dir
