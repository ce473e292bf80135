"""A model card: what a model directory is and how it was made, as one JSON-ready dict.

From the model directory alone: architecture and dims, parameters, vocabularies, languages
(a multilingual model's target languages too), the step it was saved at and the dev scores
it was saved with. When it sits in a training
run (RUN_DIR/best, RUN_DIR/averaged, RUN_DIR/checkpoints/step_N), also: the recipe
(RUN_DIR/config.yaml), the run's steps, time and best dev scores (RUN_DIR/metrics.jsonl),
and the data (WORKDIR/prepared/manifest.json). A CTranslate2 export (``nmtkit export``)
gets its source model's card plus how it was exported. Parts that cannot be found are left
out. No weights are loaded.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Optional

from nmtkit.errors import CheckpointError, NmtkitError
from nmtkit.modeldir import read_json
from nmtkit.runlog import is_count, is_finite_number, read_metrics, read_run_config
from nmtkit.storage.checksums import verify
from nmtkit.workdir import RunDir, WorkDir

TRANSFORMER_DIMS = ("d_model", "ffn_dim", "heads", "encoder_layers", "decoder_layers", "pre_norm", "norm", "ffn",
                    "tie_embeddings", "max_positions", "positions", "moe_experts", "moe_top_k", "moe_every")
RNN_DIMS = ("cell", "embed_dim", "hidden_dim", "encoder_layers", "decoder_layers", "bidirectional", "merge",
            "attention", "input_feed")
SCORES = ("dev_loss", "dev_ppl", "dev_bleu")


def find_run_dir(model_dir: Path) -> Optional[Path]:
    """The training run a model directory belongs to, if it is inside one."""
    model_dir = model_dir.resolve()
    for candidate in (RunDir(model_dir.parent), RunDir(model_dir.parent.parent)):
        if candidate.config.is_file() and candidate.metrics.is_file():
            return candidate.path
    return None


def architecture(saved: dict) -> dict:
    """The architecture's dims plus a one-line summary. Keys a saved config leaves out take their
    defaults, as loading the model does (a config from before a key existed, or written by hand)."""
    from nmtkit.config import ModelConfig
    from nmtkit.config.schema import recipe_key

    model = {**{recipe_key(name): value for name, value in dataclasses.asdict(ModelConfig()).items()}, **saved}
    if model["arch"] == "transformer":
        norm = f"{'pre' if model['pre_norm'] else 'post'}-norm {model['norm']}"
        summary = (f"d {model['d_model']}, ffn {model['ffn_dim']} ({model['ffn']}), heads {model['heads']}, "
                   f"layers {model['encoder_layers']}+{model['decoder_layers']}, {norm}, "
                   f"{model.get('positions', 'sinusoidal')} positions")
        if model["positions"] == "sinusoidal" and model["sinusoid_layout"] != "interleaved":
            summary += f" ({model['sinusoid_layout']})"  # Marian's sines-then-cosines
        summary += "" if model["embed_scale"] else ", unscaled embeddings"
        summary += ", output bias" if model["output_bias"] else ""
        if model.get("moe_experts"):
            summary += (f", MoE {model['moe_experts']} experts top-{model['moe_top_k']} "
                        f"every {model['moe_every']} layer(s)")
        keys = TRANSFORMER_DIMS
    else:
        summary = (f"{model['cell']}, embed {model['embed_dim']}, hidden {model['hidden_dim']}, layers "
                   f"{model['encoder_layers']}+{model['decoder_layers']}, "
                   f"{'bi' if model['bidirectional'] else 'uni'}directional encoder, {model['attention']} attention")
        keys = RNN_DIMS
    return {"arch": model["arch"], "summary": summary, **{k: model[k] for k in keys if k in model}}


def training_summary(run_dir: Path) -> dict:
    """Steps, training time and the best dev scores of a run, from its metrics.jsonl."""
    records = [record for record in read_metrics(run_dir) if isinstance(record, dict)]
    train = [r for r in records if r.get("type") == "train"]
    valid = [r for r in records if r.get("type") == "valid"]
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    if train:
        out["steps"] = train[-1]["step"]
        out["train_minutes"] = round(train[-1].get("train_seconds", 0.0) / 60, 1)
        out["final_train_loss"] = train[-1].get("loss")
    for field, better in (("dev_bleu", max), ("dev_loss", min), ("dev_ppl", min)):
        scored = [r for r in valid if isinstance(r.get(field), (int, float))]
        if scored:
            best = better(scored, key=lambda r: r[field])
            out[f"best_{field}"] = {"score": best[field], "step": best["step"]}
    return out


def data_summary(manifest_path: Path) -> dict:
    """Source, pairs and tokens per split, and cleaning counts from a prepare manifest
    (verified against prepared/checksums.json; CheckpointError when it is damaged)."""
    verify(manifest_path.parent, [manifest_path.name], CheckpointError)
    manifest = read_json(manifest_path, "prepare manifest")
    try:
        return _data_summary(manifest, manifest_path)
    except (AttributeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{manifest_path}: unexpected content ({type(err).__name__}: {err})") from None


def _data_summary(manifest: dict, manifest_path: Path) -> dict:
    """The card's data part, every value it shows checked to be of the kind prepare writes
    (TypeError naming the first that is not: the caller leaves the part out, saying why)."""
    if not isinstance(manifest, dict):
        raise TypeError("not a JSON object")
    tokens, splits_in, cleaning = manifest.get("tokens", {}), manifest.get("splits", {}), manifest.get("cleaning", {})
    for key, value in (("tokens", tokens), ("splits", splits_in), ("cleaning", cleaning)):
        if not isinstance(value, dict):
            raise TypeError(f"{key} must be a mapping, got {value!r}"[:200])
    splits = {}
    for split, info in splits_in.items():
        if not isinstance(info, dict) or not (info.get("pairs") is None or is_count(info["pairs"])):
            raise TypeError(f"splits.{split} must give a count of pairs, got {info!r}"[:200])
        splits[split] = {"pairs": info.get("pairs")}
        if split in tokens:
            counts = tokens[split]
            if not isinstance(counts, dict) or not all(is_count(counts.get(side)) for side in ("src", "tgt")):
                raise TypeError(f"tokens.{split} must give src and tgt counts, got {counts!r}"[:200])
            splits[split]["tokens"] = {side: counts[side] for side in ("src", "tgt")}
    if not all(cleaning.get(key) is None or is_count(cleaning[key]) for key in ("read", "kept")):
        raise TypeError("cleaning.read and cleaning.kept must be counts")
    return {"manifest": str(manifest_path), "source": manifest.get("source"), "splits": splits,
            **({"train_read": cleaning["read"], "train_kept": cleaning.get("kept")} if "read" in cleaning else {})}


def recipe_settings(config: dict) -> dict:
    """The resolved recipe's values that differ from the defaults, as dotted keys (name aside)."""
    from nmtkit.config import Config

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    defaults = flat(json.loads(json.dumps(Config().to_dict())))
    return {k: v for k, v in flat(config).items() if k != "name" and defaults.get(k, object()) != v}


def model_card(model_dir: str | Path, warn: Callable[[str], None] = lambda message: None) -> dict:
    """Everything ``nmtkit info`` shows, as one JSON-ready dict. The model directory must be
    sound; a damaged run config or data manifest beside it is left out, said through ``warn``."""
    from nmtkit.ctranslate2.export import META as EXPORT_META
    from nmtkit.data.mapped_vocab import vocab_files
    from nmtkit.modeldir import model_config_from_meta, read_meta

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory not found: {model_dir}")
    if (model_dir / EXPORT_META).is_file():
        return export_card(model_dir, warn)
    meta = read_meta(model_dir)
    model_config_from_meta(meta, model_dir / "config.json")
    verify(model_dir, vocab_files(meta), CheckpointError)
    card = basic_card(model_dir, meta, warn)
    run_dir = find_run_dir(model_dir)
    if run_dir is None:
        return card
    try:
        card["training"] = training_summary(run_dir)
    except (NmtkitError, UnicodeDecodeError, KeyError) as err:
        warn(f"training left out: {RunDir(run_dir).metrics}: {err}")
    run = RunDir(run_dir)
    config = run_config(run, warn)
    if config is not None:
        card["recipe"] = {"name": config.get("name", meta.get("recipe")), "config": str(run.config),
                          "settings": recipe_settings(config)}
    manifest = run.workdir.manifest
    if not manifest.is_file() and config and isinstance(config.get("workdir"), str) and config["workdir"]:
        manifest = WorkDir(Path(config["workdir"])).manifest
    if manifest.is_file():
        try:
            card["data"] = data_summary(manifest)
        except CheckpointError as err:
            warn(f"data left out: {err}")
    return card


def basic_card(model_dir: Path, meta: dict, warn: Callable[[str], None] = lambda message: None) -> dict:
    """What a model's own metadata (config.json, or an export's nmtkit.json) tells."""
    from nmtkit.data.mapped_vocab import load_vocabs
    from nmtkit.modeldir import saved_decode

    spm = meta["spm"]
    src_vocab, tgt_vocab = load_vocabs(model_dir, meta)
    return {
        "model_dir": str(model_dir),
        "architecture": architecture(meta["model"]),
        "parameters": meta.get("parameters"),
        # per token; model directories from before MoE layers existed are dense: all are active
        "active_parameters": meta.get("active_parameters", meta.get("parameters")),
        "vocabulary": {"source": len(src_vocab), "target": len(tgt_vocab),
                       "joint": spm["src"] == spm["tgt"] or src_vocab.pieces(range(len(src_vocab))) ==
                       tgt_vocab.pieces(range(len(tgt_vocab)))},
        "languages": {"source": meta.get("src_lang"), "target": meta.get("tgt_lang")},
        # a multilingual model: what translate --target-lang (serve's target_lang) may name; [] for one direction
        "target_languages": src_vocab.target_languages(),
        # an imported model: where it came from (nmtkit/pretrained/)
        **({"imported_from": meta["imported_from"]} if isinstance(meta.get("imported_from"), dict) else {}),
        "checkpoint": _saved_at(model_dir, meta, warn),
        # a fine-tuned model: the model directory its training started from (training/init_from.py)
        **({"init_from": meta["init_from"]} if isinstance(meta.get("init_from"), dict) else {}),
        # what `translate -m` uses unless flags say otherwise; "defaults" for a model saved without them
        "decode": {**dataclasses.asdict(saved_decode(meta, model_dir)), "from": _decode_origin(meta)},
        "nmtkit_version": meta.get("nmtkit_version"),
    }


def _saved_at(model_dir: Path, meta: dict, warn: Callable[[str], None]) -> dict:
    """The step, dev scores and averaged checkpoints a model was saved with; a value of another
    kind (a hand-edited or foreign config) is left out, said through ``warn``."""
    kinds = {"step": ("a count", is_count), "averaged_from": ("a list of checkpoint names", lambda v: isinstance(
        v, list) and all(isinstance(name, str) for name in v)), **{k: ("a number", is_finite_number) for k in SCORES}}
    saved = {}
    for key, (kind, fits) in kinds.items():
        if key in meta and fits(meta[key]):
            saved[key] = meta[key]
        elif key in meta:
            warn(f"{model_dir}: its {key} is not {kind} ({_shown(meta[key])}): left out of the card")
    return saved


def _shown(value: Any, limit: int = 80) -> str:
    """A value from a file, for a warning: its repr (quoted, newlines and other characters
    escaped), cut to ``limit`` characters, as a hand-edited config may hold anything."""
    text = ascii(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _decode_origin(meta: dict) -> str:
    """Where a model's saved decode settings came from, for the card."""
    if "decode" not in meta:
        return "defaults"
    return "imported generation_config" if isinstance(meta.get("imported_from"), dict) else "recipe"


def export_card(export_dir: Path, warn: Callable[[str], None]) -> dict:
    """A CTranslate2 export's card: its source model's (training, data, recipe) while that
    directory exists, else what the export's metadata tells; plus how it was exported."""
    from nmtkit.ctranslate2.engine import read_export_meta
    from nmtkit.ctranslate2.export import META as EXPORT_META
    from nmtkit.modeldir import CONFIG, model_config_from_meta

    meta = read_export_meta(export_dir)  # verified against the export's checksums.json
    source = Path(meta.get("source_model", ""))
    exported_from_model = bool(meta.get("source_model")) and (source / CONFIG).is_file()
    if exported_from_model and meta.get("source_weights_sha256"):
        # a run's best/ or averaged/ is replaced as training goes on: its card then tells of another model
        try:
            current = read_json(source / CONFIG, "model config")
        except CheckpointError:
            current = None
        if not isinstance(current, dict) or current.get("weights_sha256") != meta["source_weights_sha256"]:
            warn(f"{source} holds other weights than were exported: showing the export's own metadata")
            exported_from_model = False
    if not exported_from_model:
        if not isinstance(meta.get("model"), dict):
            gone = f"its source model {source} is gone" if meta.get("source_model") else "it names no source model"
            raise CheckpointError(f"{export_dir}: its {EXPORT_META} holds no model config and {gone}: nothing tells "
                                  f"what model it is; export the model again")
        model_config_from_meta(meta, export_dir / EXPORT_META)
    card = model_card(source, warn) if exported_from_model else basic_card(export_dir, meta, warn)
    card["model_dir"] = str(export_dir)
    card["export"] = {k: meta.get(k) for k in ("format", "ctranslate2_version", "quantization", "source_model")}
    return card


def run_config(run: RunDir, warn: Callable[[str], None]) -> Optional[dict]:
    """The run's resolved recipe, read once and held to the rules of a recipe; None (said through
    ``warn``) when it is missing or damaged."""
    from nmtkit.config import from_dict

    try:
        config = read_run_config(run.path)
        if config is not None:
            from_dict(config)  # what it means, held to the recipe rules
    except NmtkitError as err:
        warn(f"recipe left out: {err}" if str(run.config) in str(err) else f"recipe left out: {run.config}: {err}")
        return None
    return config


def print_card(card: dict, file=None) -> None:
    """The card as a rich table on ``file`` (default stdout; colours only on a terminal)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"model card: {card['model_dir']}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    arch, vocab, languages = card["architecture"], card["vocabulary"], card["languages"]
    table.add_row("architecture", f"{arch['arch']}: {arch['summary']}")
    table.add_row("parameters", _text(card.get("parameters")))
    table.add_row("parameters active per token", _text(card.get("active_parameters")))
    table.add_row("vocabulary", f"{vocab['source']:,} joint" if vocab["joint"]
                  else f"{vocab['source']:,} source / {vocab['target']:,} target")
    table.add_row("languages", f"{languages['source']} -> {languages['target']}")
    if card.get("target_languages"):
        table.add_row("target languages", f"{', '.join(card['target_languages'])} (--target-lang)")
    decode = card["decode"]
    free_eos = "EOS at the limit free, " if decode.get("eos_at_limit") == "free" else ""
    table.add_row("decode", f"beam {decode['beam_size']}, lenpen {decode['lenpen']}, length <= "
                  f"{decode['max_len_a']} x source + {decode['max_len_b']}, min {decode['min_len']}, "
                  f"{free_eos}{decode['batch_tokens']} tokens a batch (from the {decode['from']})")
    table.add_row("saved at", "; ".join(f"{k.replace('_', ' ')} {_text(v)}" for k, v in card["checkpoint"].items()))
    imported = card.get("imported_from")
    if imported:
        revision = f", revision {imported['revision']}" if imported.get("revision") else ""
        table.add_row("imported from", f"{imported.get('source')} ({imported.get('format')}{revision})")
    init = card.get("init_from")
    if init:
        table.add_row("started from", f"{init.get('path')} (step {_text(init.get('step'))}; fine-tuned)")
    export = card.get("export")
    if export:
        table.add_row("export", f"{export['format']} {export['ctranslate2_version']}, {export['quantization']} "
                                f"weights, from {export['source_model']}")
    for key, value in card.get("training", {}).items():
        table.add_row(f"training: {key.replace('_', ' ')}", _text(value))
    data = card.get("data")
    if data:
        table.add_row("data", f"{data['source']} ({data['manifest']})")
        for split, info in data["splits"].items():
            tokens = info.get("tokens", {})
            table.add_row(f"data: {split}", f"{_text(info['pairs'])} pairs" +
                          (f", {_text(tokens['src'])} / {_text(tokens['tgt'])} tokens" if tokens else ""))
    recipe = card.get("recipe")
    if recipe:
        table.add_row("recipe", f"{recipe['name']} ({recipe['config']})")
        for key, value in recipe["settings"].items():
            table.add_row(f"  {key}", _text(value))
    Console(file=file or sys.stdout, highlight=False).print(table)


def _text(value: Any) -> str:
    """A card value for the table: thousands separators, short floats, best-of dicts."""
    if isinstance(value, dict) and set(value) == {"score", "step"} and is_count(value["step"]):
        return f"{_text(value['score'])} at step {value['step']:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def info_command(model_dir: Path, as_json: bool, warn: Callable[[str], None] = lambda message: None) -> None:
    """``nmtkit info``: the model card as a table, or as one JSON object on stdout."""
    card = model_card(model_dir, warn)
    if as_json:
        print(json.dumps(card, indent=1, ensure_ascii=False))
    else:
        print_card(card)
