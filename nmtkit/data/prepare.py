"""``nmtkit prepare``: fetch parallel data, clean it, train SentencePiece, encode every split.

Work-dir layout (training, translation and scoring rely on it):

    <workdir>/config.yaml            the resolved config
    <workdir>/prepared/
      {dev,test}.{src,tgt}           plain text, one sentence a line, as the source gave them
                                     (translated and scored as BLEU references)
      train.{src,tgt}.gz             the cleaned training text (what the ids encode), gzip
      spm.model                      joint SentencePiece model (or spm.src.model + spm.tgt.model)
      {train,dev,test}.npz           token ids (nmtkit.data.ids), memory-mapped by `train`
      manifest.json                  source, provenance, line counts and sha256 per file (of
                                     the text, for .gz), cleaning counts, vocab sizes, token counts
      checksums.json                 size and sha256 of every file above (nmtkit.storage.checksums);
                                     readers verify what they read against it
      stamps/{fetch,spm,encode}.json what each step was made from

Each step runs only when what it depends on changed: ``fetch`` (read the source, write dev,
test and the text-filtered train, ``train.prefilter.{src,tgt}``) on the data config and the
source's fingerprint; ``spm`` on the vocab config and the fetched train text; ``encode``
(length filters, ids, the cleaned text) on the length limits, the models and the texts (the
stamps: ``steps.py``); every file is written atomically. The summary it prints: ``summary.py``.

The directory stays near the size of the source text, not ~2.7x as with two plain copies beside
the ids (the quickstart's 31k pairs: 8.0 MB for 7.5 MB of training text, was 20.2 MB; the ids,
2 bytes a piece and 16 a pair, are 0.55x of it, the kept text at gzip's fastest level 0.38x):
``train.prefilter.*`` lives only between fetch and encode (``steps.consume`` deletes it and its
stamp records it absent), so a second prepare with the same config still does nothing, and one
whose vocabulary or length limits changed reads the source again before SentencePiece or
encoding: re-reading costs less than training SentencePiece and encoding, which it precedes,
and keeping the text would cost a copy of the corpus on disk for every prepared directory. The
cleaned text stays for what reads the training sources (distillation, back-translation,
looking at what was kept), compressed because nothing in nmtkit reads it.

Memory stays bounded whatever the corpus size: the training pairs stream through cleaning
(duplicates found by 8-byte hashes, ``clean.SeenHashes``); SentencePiece reads a seeded uniform
sample of ``vocab.input_sentence_size`` lines of the whole corpus (its own memory grows with that
sample; a large one trains in a child process); encoding streams chunks of pairs through worker
processes into the id files (``ids.SplitWriter``) and the kept training text.
"""
from __future__ import annotations

import collections
import functools
import json
import os
from pathlib import Path

import numpy as np

from nmtkit.config import Config, save_config
from nmtkit.data.clean import RULES, length_filter
from nmtkit.data.corpora import CorpusStream, source_fingerprint
from nmtkit.data.encoder import Encoder, Tally, encode_split
from nmtkit.data.identity import changes, identity, prepared_settings, read_record
from nmtkit.data.ids import SplitWriter
from nmtkit.data.ownership import check_prepared_dir
from nmtkit.data.sources import fingerprint
from nmtkit.data.sources.corpus import Pair
from nmtkit.data.steps import UNFINISHED, consume, current_report, read_stamp, remove_leftovers, run_step
from nmtkit.data.summary import counts_text, print_summary
from nmtkit.data.textfiles import open_lines, read_text, write_lines, write_pairs
from nmtkit.data.mapped_vocab import id_map_of, open_vocab
from nmtkit.data.vocab import reused_models, sampled_lines, spm_files, spm_model_type, train_spm
from nmtkit.errors import ConfigError, DataError
from nmtkit.storage.checksums import MANIFEST, write_manifest
from nmtkit.storage.files import atomic_open, exclusive, sha256_file, write_text_if_changed
from nmtkit.workdir import WorkDir

FORMAT = 1  # bump when a step's outputs change meaning, so old work dirs are redone
MANIFEST_FORMAT = 2  # manifest.json's own: 2 always records `settings` (older manifests may lack them)
ENCODE_FORMAT = 2  # encode's own: 2 keeps the cleaned training text gzip-compressed
SPLITS = ("train", "dev", "test")
SAMPLE_SEED = 1  # SentencePiece's training sample: the same lines every time


def prepare(cfg: Config, console) -> dict:
    """Run the three steps as needed, write the manifest, print a summary and return it."""
    data = cfg.data
    if data.src_lang == data.tgt_lang:
        raise ConfigError(f"data.src_lang and data.tgt_lang are both {data.src_lang!r}; they must differ")
    out = WorkDir.of(cfg).prepared
    check_prepared_dir(data, out)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive(out, "another `nmtkit prepare` or a `nmtkit train` reading it"):
        remove_leftovers(out)
        save_config(cfg, WorkDir.of(cfg).config, only_ours=True)  # left alone when unchanged
        status = {}
        fetch, spm, encoded = _run_steps(cfg, out, console, status)
        consumed = _consume_fetched_train(out, cfg.data, fetch)
        manifest = _manifest(cfg, fetch, spm, encoded)
        rewritten = write_text_if_changed(out / "manifest.json",
                                          json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        if rewritten or consumed or "done" in status.values() or not (out / MANIFEST).is_file():
            write_manifest(out, [p.name for p in out.iterdir()
                                 if p.is_file() and not p.name.startswith(".") and p.name != MANIFEST])
        (out / UNFINISHED).unlink(missing_ok=True)  # every step done and recorded: training may read it
        if "done" in (status["spm"], status["encode"]):
            _warn_if_a_run_is_left_behind(cfg, out, console)
    print_summary(console, manifest, status, out)
    return {**manifest, "steps": status, "prepared_dir": str(out)}


def _run_steps(cfg: Config, out: Path, console, status: dict) -> tuple[dict, dict, dict]:
    """fetch, spm and encode, each as needed (``status``: what each did). The fetched training
    text is gone once encoded: when spm or encode has to run again, fetch runs again first."""
    fetch_inputs = _fetch_inputs(cfg)
    fetch, status["fetch"] = run_step(out, "fetch", fetch_inputs, lambda: _fetch(cfg, out, console))
    if not all((out / name).is_file() for name in _fetched_train(cfg.data)) and not _encoded(cfg, out, fetch):
        fetch, status["fetch"] = run_step(out, "fetch", fetch_inputs, lambda: _fetch(cfg, out, console), force=True)
    spm, status["spm"] = run_step(out, "spm", _spm_inputs(cfg, fetch, out),
                                  lambda: _make_vocab(cfg, out, fetch, console))
    encoded, status["encode"] = run_step(out, "encode", _encode_inputs(cfg, fetch, spm),
                                         lambda: _encode(cfg, out, fetch, console))
    return fetch, spm, encoded


def _encoded(cfg: Config, out: Path, fetch: dict) -> bool:
    """Whether spm and encode are both up to date with ``fetch`` (so neither reads its text)."""
    spm = current_report(out, "spm", _spm_inputs(cfg, fetch, out))
    return spm is not None and current_report(out, "encode", _encode_inputs(cfg, fetch, spm)) is not None


def _langs(data) -> tuple[str, str]:
    return data.src_lang, data.tgt_lang


def _fetched_train(data) -> list[str]:
    """The fetched training text: an intermediate of fetch, read by spm and encode."""
    return [f"train.prefilter.{data.src_lang}", f"train.prefilter.{data.tgt_lang}"]


def _consume_fetched_train(out: Path, data, fetch: dict) -> bool:
    """Delete the fetched training text, which encode's ids and kept text now hold; True if it
    did. Text fetched by an nmtkit that recorded no byte counts stays (SentencePiece's byte cap
    measures the files instead) until the next fetch."""
    names = _fetched_train(data)
    return all("bytes" in fetch["files"][name] for name in names) and consume(out, "fetch", names)


def _warn_if_a_run_is_left_behind(cfg: Config, out: Path, console) -> None:
    """Say so when the data just prepared is not what the run beside it trained on: its
    checkpoints no longer fit, and `nmtkit train` will refuse to resume them."""
    from nmtkit.data.ids import load_split

    run_dir = WorkDir.of(cfg).run
    recorded = read_record(run_dir.data_record, console.warn)
    if recorded is None or not any(run_dir.checkpoints.glob("step_*")):
        return
    current = identity({name: out / name for name in set(spm_files(cfg.vocab.joint))}, load_split(out / "train.npz"))
    changed = changes(recorded, current)
    if changed:
        console.warn(f"the data changed under the run in {run_dir.path} ({'; '.join(changed)}): `nmtkit train` "
                     f"will not resume it; `nmtkit train --restart` starts over (the old run is moved aside)")


# --- fetch: read the source(s), text rules, write dev/test/train.prefilter ----------------------

def _fetch_inputs(cfg: Config) -> dict:
    data = cfg.data
    split = {"split_seed": data.split_seed} if data.split_seed else {}  # split 0 keeps the stamps it had
    if data.corpora:
        corpora = [{"name": c.name, "tag": c.tag, "source": c.source, "langs": [c.src_lang, c.tgt_lang],
                    "max_train_pairs": c.max_train_pairs, "input": source_fingerprint(c, first=i == 0, index=i)}
                   for i, c in enumerate(data.training_sources())]
        return {"format": FORMAT, "langs": [data.src_lang, data.tgt_lang], "dedup": data.clean.dedup,
                "corpora": corpora, **split}
    return {"format": FORMAT, "source": data.source, "langs": [data.src_lang, data.tgt_lang],
            "max_train_pairs": data.max_train_pairs, "dedup": data.clean.dedup, "input": fingerprint(data), **split}


def _fetch(cfg: Config, out: Path, console) -> tuple[dict, list[str]]:
    data = cfg.data
    with console.terminal_bar(f"reading {data.source or 'the corpora'} data", None):
        corpora = CorpusStream(data)
    for split in ("dev", "test"):
        if not getattr(corpora, split):
            raise DataError(f"the {split} split of the {corpora.name} data is empty")
    files = {}
    for split in ("dev", "test"):
        files.update(write_pairs(out, split, _langs(data), getattr(corpora, split)))
    files.update(_write_corpus_tests(out, data, corpora.other_tests))
    with console.terminal_bar("cleaning training pairs", corpora.total) as advance:
        files.update(write_pairs(out, "train.prefilter", _langs(data), corpora.train(advance)))
    if not files[f"train.prefilter.{data.src_lang}"]["lines"]:
        raise DataError(f"no training pairs left after cleaning ({counts_text(corpora.filter.counts)})")
    report = {"source": data.source or "corpora", "provenance": corpora.provenance,
              "cleaning": corpora.filter.counts, "files": files}
    if data.corpora:
        report["corpora"] = corpora.counts
    return report, list(files)


def _write_corpus_tests(out: Path, data, tests: dict[str, list[Pair]]) -> dict[str, dict]:
    """test.NAME.{src,tgt} of each later corpus with a test set (`nmtkit run` scores each); those of
    a corpus renamed, or without a test set now, are removed."""
    written = {out / f"test.{name}.{data.src_lang}" for name in tests}
    for stale in set(out.glob(f"test.*.{data.src_lang}")) - written:
        for lang in (data.src_lang, data.tgt_lang):
            stale.with_suffix(f".{lang}").unlink(missing_ok=True)
    files = {}
    for name, pairs in tests.items():
        files.update(write_pairs(out, f"test.{name}", _langs(data), pairs))
    return files


# --- spm: SentencePiece on the fetched training text, or reused (vocab.from) ---------------------

def _spm_inputs(cfg: Config, fetch: dict, out: Path) -> dict:
    vocab = cfg.vocab
    if vocab.from_ and not Path(vocab.from_).expanduser().is_dir():
        recorded = _recorded_reuse(cfg, out)
        if recorded is not None:
            return recorded
    if vocab.from_:  # the reused models themselves, whatever text they were trained on
        models = dict(zip(spm_files(vocab.joint), reused_models(vocab.from_, vocab.joint)))
        models.update({id_map_of(name).name: id_map_of(path) for name, path in models.items() if id_map_of(path).is_file()})
        inputs = {"format": FORMAT, "from": {name: sha256_file(path) for name, path in models.items()},
                  "size": vocab.size, "type": vocab.type}  # the type: checked against the models on a re-run
    else:
        settings = {key: getattr(vocab, key) for key in ("type", "size", "joint", "character_coverage",
                                                         "input_sentence_size")}
        settings.update(_spm_options(vocab, changed_only=True))
        train = {name: fetch["files"][name]["sha256"] for name in _fetched_train(cfg.data)}
        capped = _byte_capped_samples(cfg, fetch, out)
        if capped:  # recorded only where the byte cap binds, so stamps of smaller corpora stay as they were
            settings["sample_lines"] = capped
        inputs = {"format": FORMAT, "vocab": settings, "train": train}
    return {**inputs, "tags": cfg.data.tags} if cfg.data.tags else inputs  # reserved pieces of the source model


def _recorded_reuse(cfg: Config, out: Path) -> dict | None:
    """The spm step's recorded inputs when vocab.from (now gone) was copied from that very directory
    with the recipe's other vocab settings: the copies, checked against their stamp, are what it
    held, so a fine-tuning run may go on after its general model was moved or deleted. None
    otherwise (the step runs, and reports the missing directory)."""
    stamp = read_stamp(out, "spm")
    if stamp is None or not isinstance(stamp.get("inputs"), dict) or not isinstance(stamp["inputs"].get("from"), dict):
        return None
    recorded, report = stamp["inputs"], stamp["report"]
    expected = json.loads(json.dumps({"format": FORMAT, "from": recorded["from"], "size": cfg.vocab.size,
                                      "type": cfg.vocab.type, **({"tags": cfg.data.tags} if cfg.data.tags else {})}))
    same_place = isinstance(report, dict) and report.get("from") == str(Path(cfg.vocab.from_).expanduser().resolve())
    models = set(spm_files(cfg.vocab.joint))
    same_layout = set(recorded["from"]) - {id_map_of(name).name for name in models} == models  # vocab.joint
    return recorded if same_place and same_layout and recorded == expected else None


def _spm_options(vocab, changed_only: bool = False) -> dict:
    """SentencePiece's byte_fallback, normalization and split_digits as the recipe resolves them;
    ``changed_only``: only those that differ from what SentencePiece did before nmtkit had the keys,
    so the stamps of a directory prepared then still match (its spm step is not redone)."""
    options = {"byte_fallback": vocab.uses_byte_fallback(), "normalization": vocab.normalization,
               "split_digits": vocab.split_digits}
    before = {"byte_fallback": False, "normalization": "nmt_nfkc", "split_digits": False}
    return {key: value for key, value in options.items() if not changed_only or value != before[key]}


def _make_vocab(cfg: Config, out: Path, fetch: dict, console) -> tuple[dict, list[str]]:
    """Train the SentencePiece model(s), or copy them from ``vocab.from``, into ``out``."""
    vocab = cfg.vocab
    for name in {*spm_files(True), *spm_files(False)}:  # the other layout's, and any id map: stale
        stale = [id_map_of(out / name)] + ([] if name in spm_files(vocab.joint) else
                                           [out / name, (out / name).with_suffix(".vocab")])
        for path in stale:
            path.unlink(missing_ok=True)
    models = _reuse_vocab(cfg, out) if vocab.from_ else _train_vocab(cfg, out, fetch, console)
    report = {"type": vocab.type, "joint": vocab.joint,
              "models": {name: {"size": len(open_vocab(out / name)), "sha256": sha256_file(out / name)}
                         for name in models},
              "byte_fallback": all(open_vocab(out / name).byte_fallback for name in models)}
    if vocab.from_:
        report["from"] = str(Path(vocab.from_).expanduser().resolve())
    return report, [file for name in models for file in (name, str(Path(name).with_suffix(".vocab")),
                                                         id_map_of(name).name) if (out / file).is_file()]


def _train_vocab(cfg: Config, out: Path, fetch: dict, console) -> list[str]:
    vocab, data = cfg.vocab, cfg.data
    capped = _byte_capped_samples(cfg, fetch, out)
    src_name = spm_files(vocab.joint)[0]
    jobs = _spm_jobs(cfg)
    for name, texts in jobs.items():
        # a uniform sample of the whole corpus (not its first lines); only the sample is written for
        # SentencePiece, and a large one trains in a child process whose memory goes back before encoding
        total = sum(fetch["files"][text]["lines"] for text in texts)
        lines = capped.get(name, vocab.input_sentence_size)
        sample = sampled_lines(read_text(*(out / text for text in texts)), total, lines, SAMPLE_SEED)
        large = min(total, lines or total) >= Encoder.MIN_PARALLEL_LINES
        with console.terminal_bar(f"SentencePiece {name}", None):  # tags go before source sentences only
            train_spm(sample, out / name, vocab.size, vocab.type, vocab.character_coverage,
                      lines, reserved=data.tags if name == src_name else (), in_subprocess=large,
                      max_pieces=data.clean.max_len, **_spm_options(vocab))
    return list(jobs)


def _spm_jobs(cfg: Config) -> dict[str, list[str]]:
    """SentencePiece model file -> the fetched training texts it learns from."""
    texts = _fetched_train(cfg.data)
    src_name, tgt_name = spm_files(cfg.vocab.joint)
    return {src_name: texts} if cfg.vocab.joint else {src_name: texts[:1], tgt_name: texts[1:]}


def _byte_capped_samples(cfg: Config, fetch: dict, out: Path) -> dict[str, int]:
    """Models whose sample vocab.input_bytes cuts below vocab.input_sentence_size -> its lines:
    as many as hold about input_bytes of text at the corpus's mean line length (SentencePiece's
    memory follows the text it holds, not the line count)."""
    vocab, capped = cfg.vocab, {}
    for name, texts in _spm_jobs(cfg).items():
        total = sum(fetch["files"][text]["lines"] for text in texts)
        size = sum(fetch["files"][text].get("bytes") or (out / text).stat().st_size for text in texts)
        lines = min(total, vocab.input_sentence_size or total)
        if vocab.input_bytes and total and lines * size / total > vocab.input_bytes:
            capped[name] = max(1, int(vocab.input_bytes * total / size))
    return capped


def _reuse_vocab(cfg: Config, out: Path) -> list[str]:
    """Copy the model(s) of ``vocab.from``: vocab.size must be theirs (the model is built from it)
    and each corpus tag a reserved piece of the source model."""
    vocab = cfg.vocab
    models = dict(zip(spm_files(vocab.joint), reused_models(vocab.from_, vocab.joint)))
    _check_one_id_space(cfg, models)
    for source in models.values():
        size = len(open_vocab(source))
        if size != vocab.size:
            raise ConfigError(f"vocab.size is {vocab.size} but {source} (vocab.from) has {size} pieces; "
                              f"set vocab.size: {size}")
        kind = spm_model_type(source)  # subword sampling reads its settings by type
        if kind != vocab.type:
            fix = f"set vocab.type: {kind}" if kind in ("unigram", "bpe") else "nmtkit uses unigram or bpe models"
            raise ConfigError(f"vocab.type is {vocab.type} but {source} (vocab.from) is a {kind} model; {fix}")
    src_model = models[spm_files(vocab.joint)[0]]
    for tag in cfg.data.tags:
        if not open_vocab(src_model).is_reserved(tag):
            raise ConfigError(f"the corpus tag {tag} is not a reserved piece of {src_model} (vocab.from): "
                              f"reuse a model trained with that tag, or train a new vocabulary")
    for name, source in models.items():
        with atomic_open(out / name, "wb") as handle:
            handle.write(source.read_bytes())
        (out / name).with_suffix(".vocab").unlink(missing_ok=True)  # a trained model's piece list: not this one's
        if id_map_of(source).is_file():  # an imported model's numbering goes with its model
            with atomic_open(id_map_of(out / name), "wb") as handle:
                handle.write(id_map_of(source).read_bytes())
    return list(models)


def _check_one_id_space(cfg: Config, models: dict) -> None:
    """Separate models tied as one table (model.tie_embeddings=all) must number their pieces alike:
    only an imported model's two SentencePiece models over one id map do. Two plain models are
    refused even when their piece lists are equal: a model directory with two of them and no id
    maps is not one vocabulary to everything that reads it (average, translate)."""
    if cfg.vocab.joint or cfg.model.tie_embeddings != "all":
        return
    src, tgt = (open_vocab(path) for path in models.values())
    mapped = all(id_map_of(path).is_file() for path in models.values())
    if not mapped or src.pieces(range(len(src))) != tgt.pieces(range(len(tgt))):
        raise ConfigError(f"model.tie_embeddings=all needs one vocabulary, but {cfg.vocab.from_} (vocab.from) has "
                          f"two; set model.tie_embeddings: decoder or none")


# --- encode: ids for every split, length rules on train ----------------------------------------

def _encode_inputs(cfg: Config, fetch: dict, spm: dict) -> dict:
    clean = cfg.data.clean
    inputs = {"format": ENCODE_FORMAT, "max_len": clean.max_len, "max_ratio": clean.max_ratio,
              "models": {name: info["sha256"] for name, info in spm["models"].items()},
              "text": {name: info["sha256"] for name, info in fetch["files"].items()}}
    if "corpora" in fetch:  # where each corpus starts in the text
        inputs["corpora"] = [corpus["kept"] for corpus in fetch["corpora"]]
    return inputs


def _encode(cfg: Config, out: Path, fetch: dict, console) -> tuple[dict, list[str]]:
    """Encode every split as a stream: chunks of pairs go through the encoder's workers, the length
    rules (train) and into the id files and the kept training text, one chunk at a time in memory."""
    data, clean = cfg.data, cfg.data.clean
    models = tuple(out / name for name in spm_files(cfg.vocab.joint))
    sizes = tuple(len(open_vocab(model)) for model in models)  # ids stored as uint16 when they fit
    lines = fetch["files"][f"train.prefilter.{data.src_lang}"]["lines"]
    workers = 1 if lines < Encoder.MIN_PARALLEL_LINES else (cfg.vocab.workers or os.cpu_count() or 1)
    corpus_ends = np.cumsum([corpus["kept"] for corpus in fetch["corpora"]]) if "corpora" in fetch else None
    tallies = {split: Tally(corpus_ends if split == "train" else None) for split in SPLITS}
    rules = functools.partial(length_filter, max_len=clean.max_len, max_ratio=clean.max_ratio)
    for lang in (data.src_lang, data.tgt_lang):  # the plain copy an older nmtkit kept
        (out / f"train.{lang}").unlink(missing_ok=True)
    with Encoder(workers) as encoder, console.terminal_bar("encoding", lines) as advance, \
            SplitWriter(out / "train.npz", sizes, with_corpus=corpus_ends is not None) as writer:
        with open_lines(out, "train.prefilter", _langs(data)) as lines:
            kept = encode_split(encoder, models, lines, writer, tallies["train"], rules, advance)
            files = write_lines(out, "train", _langs(data), kept, compressed=True)
    with Encoder(1) as encoder:
        for split in ("dev", "test"):  # their text is written already: the pairs are only counted
            with SplitWriter(out / f"{split}.npz", sizes) as writer, open_lines(out, split, _langs(data)) as lines:
                collections.deque(encode_split(encoder, models, lines, writer, tallies[split]), 0)
    report = {"cleaning": tallies["train"].dropped, "files": files}
    for key in ("pairs", "tokens", "unknown"):
        report[key] = {split: getattr(tally, key) for split, tally in tallies.items()}
    if corpus_ends is not None:
        report["corpora"] = tallies["train"].by_corpus
    return report, [*files, *(f"{split}.npz" for split in SPLITS)]


# --- manifest and summary ----------------------------------------------------------------------

def _manifest(cfg: Config, fetch: dict, spm: dict, encoded: dict) -> dict:
    data = cfg.data
    src_name, tgt_name = spm_files(cfg.vocab.joint)
    texts = {split: {f"{split}.{lang}": fetch["files"][f"{split}.{lang}"] for lang in (data.src_lang, data.tgt_lang)}
             for split in ("dev", "test")}
    splits = {split: {"pairs": encoded["pairs"][split], "files": encoded["files"] if split == "train" else texts[split]}
              for split in SPLITS}
    dropped = {rule: {**fetch["cleaning"], **encoded["cleaning"]}[rule] for rule in RULES}
    return {
        "format": FORMAT,
        "manifest": MANIFEST_FORMAT,
        "source": fetch["source"],
        "languages": {"src": data.src_lang, "tgt": data.tgt_lang},
        "provenance": fetch["provenance"],
        "splits": splits,
        "cleaning": {"read": fetch["cleaning"]["read"], "dropped": dropped, "kept": encoded["pairs"]["train"]},
        "vocab": {"type": spm["type"], "joint": spm["joint"],
                  "size": {"src": spm["models"][src_name]["size"], "tgt": spm["models"][tgt_name]["size"]},
                  "models": {name: info["sha256"] for name, info in spm["models"].items()},
                  **({"byte_fallback": spm["byte_fallback"]} if "byte_fallback" in spm else {}),
                  **({"from": spm["from"]} if "from" in spm else {})},
        "tokens": encoded["tokens"],
        "settings": prepared_settings(cfg),  # what `train` checks its recipe against
        # <unk> ids per split and side (stamps of an older nmtkit lack them until the next encode)
        **({"unknown": encoded["unknown"]} if "unknown" in encoded else {}),
        **({"corpora": _corpora_counts(fetch["corpora"], encoded["corpora"])} if "corpora" in encoded else {}),
    }


def _corpora_counts(fetched: list[dict], encoded: list[dict]) -> list[dict]:
    """Per corpus: its name, source and tag, pairs read, dropped by each rule, and kept."""
    return [{"name": text["name"], "source": text["source"], "tag": text["tag"], "read": text["read"],
             "dropped": {rule: {**text, **lengths}[rule] for rule in RULES}, "kept": lengths["kept"]}
            for text, lengths in zip(fetched, encoded)]
