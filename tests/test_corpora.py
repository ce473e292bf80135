"""Several training corpora with weights and tags, and multilingual models."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import sequences, tagged_model, tiny_recipe, two_corpora, write_pairs
from nmtkit.config import from_dict, load_config
from nmtkit.errors import ConfigError
from support.cli import cli_in_process
from support.text_io import quiet_console

REPO = Path(__file__).resolve().parent.parent


# --- recipe rules ------------------------------------------------------------------------------

def corpus(name: str, **keys) -> dict:
    return {"name": name, "source": "files", **keys}


@pytest.mark.parametrize("data, message", [
    ({"source": "files", "corpora": [corpus("a")]},
     "data.source is a key of one source, but data.corpora lists the sources; set it on a corpus"),
    ({"dev_size": 10, "corpora": [corpus("a")]}, "data.dev_size is a key of one source"),
    ({"corpora": [corpus("a"), corpus("a")]}, "data.corpora[1].name: two corpora are called 'a'"),
    ({"corpora": [corpus("")]}, "data.corpora[0].name must be a name of letters"),
    ({"corpora": [corpus("a", source="")]}, "data.corpora[0].source is missing; choose one of files, hf, sword"),
    ({"corpora": [corpus("a", sword_src="x")]},
     "data.corpora[0].sword_src belongs to data.corpora[0].source=sword, but data.corpora[0].source is files"),
    ({"corpora": [corpus("a"), corpus("b", weight=0)]}, "data.corpora[1].weight must be in (0, 1000], got 0.0"),
    ({"corpora": [corpus("a", weight=float("nan"))]}, "data.corpora[0].weight must be a finite number"),
    ({"corpora": [corpus("a", tag="<2 es>")]}, "data.corpora[0].tag must be up to 32 characters without spaces"),
    ({"corpora": [corpus("a", tag="</s>")]}, "data.corpora[0].tag must be up to 32 characters"),
    ({"corpora": [corpus("a", colour="red")]}, "unknown config key data.corpora[0].colour; valid keys under"),
    ({"corpora": ["a"]}, "data.corpora[0]: expected a mapping, got 'a'"),
    ({"corpora": {"a": {}}}, "data.corpora: expected a list of mappings"),
])
def test_corpora_are_checked_like_sources(data, message):
    with pytest.raises(ConfigError) as raised:
        from_dict({"data": data})
    assert str(raised.value).startswith(message), str(raised.value)


def test_corpora_take_the_data_languages_and_a_resolved_config_reloads():
    cfg = from_dict({"data": {"src_lang": "src", "tgt_lang": "tgt", "corpora": [
        corpus("a", tag="<2x>", weight=2.5), corpus("b", src_lang="de", tag="<bt>")]}})
    sources = cfg.data.training_sources()
    assert [(s.name, s.src_lang, s.tgt_lang, s.weight) for s in sources] == [("a", "src", "tgt", 2.5),
                                                                          ("b", "de", "tgt", 1.0)]
    assert cfg.data.tags == ["<2x>", "<bt>"]
    assert from_dict(cfg.to_dict()) == cfg
    single = from_dict({"data": {"source": "files"}})
    assert [(s.name, s.tag, s.weight) for s in single.data.training_sources()] == [("files", "", 1.0)]


def test_the_bidirectional_recipe_loads_and_dry_runs(tmp_path, monkeypatch, capsys):
    cfg = load_config(REPO / "recipes" / "quickstart-bidirectional.yaml")
    assert [(c.name, c.sword_src, c.tag) for c in cfg.data.corpora] == [
        ("en-es", "engWEB2015eb", "<2es>"), ("es-en", "spaRV1909eb", "<2en>")]
    code, _, err = cli_in_process(monkeypatch, capsys, "train", str(REPO / "recipes" / "quickstart-bidirectional.yaml"),
                                  "--dry-run", f"workdir={tmp_path}")
    assert code == 0, err
    assert "7,578,624" in err  # the quickstart's model (pre-norm: two final norms more than the paper's)


# --- prepare: tags, per-corpus counts, corpus of each pair -------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from nmtkit.data.prepare import prepare

    root = tmp_path_factory.mktemp("corpora")
    recipe = two_corpora(root)
    sizes = recipe.pop("_sizes")
    console = quiet_console()
    manifest = prepare(from_dict(recipe), console)
    return recipe, manifest, sizes, console.file.getvalue()


def test_prepare_counts_each_corpus_and_tags_its_sources(prepared):
    from nmtkit.data.ids import load_split
    from nmtkit.data.vocab import Vocab

    recipe, manifest, (n_rev, n_copy), printed = prepared
    empty = {"empty": 0, "duplicate": 0, "heldout": 0, "too_long": 0, "ratio": 0}
    assert manifest["corpora"] == [
        {"name": "rev", "source": "files", "tag": "<2r>", "read": n_rev, "dropped": empty, "kept": n_rev},
        {"name": "copy", "source": "files", "tag": "<2c>", "read": n_copy + 3,
         "dropped": {**empty, "empty": 1, "duplicate": 1, "heldout": 1}, "kept": n_copy}]
    assert "corpus copy (tag <2c>): read 63, kept 60; dropped: empty 1, duplicate 1, heldout 1" in printed
    out = Path(recipe["workdir"]) / "prepared"
    sources = gzip.decompress((out / "train.src.gz").read_bytes()).decode().splitlines()
    assert all(line.startswith("<2r> ") for line in sources[:n_rev])
    assert all(line.startswith("<2c> ") for line in sources[n_rev:])
    assert all(line.startswith("<2r> ") for line in (out / "dev.src").read_text().splitlines())
    rev_test = (out / "test.src").read_text().splitlines()  # the first corpus's; the second has the same
    assert (out / "test.copy.src").read_text().splitlines() == [line.replace("<2r>", "<2c>", 1) for line in rev_test]
    assert (out / "test.copy.tgt").read_text() == (out / "test.tgt").read_text()
    ids = load_split(out / "train.npz")
    assert ids.corpus.tolist() == [0] * n_rev + [1] * n_copy
    vocab = Vocab(out / "spm.model")
    for i, line in enumerate(sources):  # the tag is one piece, the sentence's first
        tag_id = vocab.sp.PieceToId(line.split()[0])
        assert tag_id in ids.pair(i)[0].tolist()[:2] and vocab.encode(line) == ids.pair(i)[0].tolist()
    assert vocab.is_reserved("<2r>") and vocab.is_reserved("<2c>") and not vocab.is_reserved("<2z>")
    assert vocab.target_tags() == ["<2r>", "<2c>"]


def test_epoch_pairs_follow_the_weights_exactly_and_reproducibly():
    from nmtkit.data.mixing import epoch_pairs

    corpus_ids = np.repeat([0, 1, 2], [100, 40, 7])
    weights = [0.25, 2.5, 1.0]
    first = epoch_pairs(corpus_ids, weights, seed=3, epoch=0)
    assert np.bincount(corpus_ids[first]).tolist() == [25, 100, 7]
    counts = np.bincount(first[corpus_ids[first] == 1], minlength=140)[100:]
    assert sorted(set(counts.tolist())) == [2, 3] and (counts == 3).sum() == 20  # 2 copies + a distinct half
    assert len(set(first[corpus_ids[first] == 0].tolist())) == 25
    assert np.array_equal(first, epoch_pairs(corpus_ids, weights, seed=3, epoch=0))
    assert not np.array_equal(first, epoch_pairs(corpus_ids, weights, seed=3, epoch=1))
    assert np.array_equal(epoch_pairs(corpus_ids, [1, 1, 1], 3, 0), np.arange(147))  # weight 1: every pair once


def test_an_epoch_of_training_batches_has_the_weighted_mix(prepared, tmp_path):
    from nmtkit.data.mixing import epoch_pairs
    from nmtkit.models.build import build_model
    from nmtkit.training.startup import prepared_vocabs
    from nmtkit.training.trainer import Trainer

    recipe, _, (n_rev, n_copy), _ = prepared
    data = {**recipe["data"], "corpora": [{**recipe["data"]["corpora"][0], "weight": 0.5},
                                          {**recipe["data"]["corpora"][1], "weight": 3.0}]}
    cfg = from_dict({**tiny_recipe(Path(recipe["workdir"]), vocab={"size": 20}, model={"d_model": 16, "ffn_dim": 32},
                                   train={"max_steps": 6, "save_every": 6, "validate_every": 6, "threads": 1}),
                     "data": data})
    src_path, tgt_path, src_vocab, tgt_vocab = prepared_vocabs(cfg)
    trainer = Trainer(cfg, quiet_console(), build_model(cfg.model, len(src_vocab), len(tgt_vocab)),
                      torch.device("cpu"), torch.float32, src_path, tgt_path, src_vocab, tgt_vocab, tmp_path / "run")
    batches = trainer._epoch_batches(trainer.src_lengths, trainer.tgt_lengths, epoch=0)
    seen = np.concatenate(batches)
    corpus_of = trainer.train_data.corpus[seen]
    assert np.bincount(corpus_of).tolist() == [round(0.5 * n_rev), 3 * n_copy]
    assert sorted(seen.tolist()) == sorted(epoch_pairs(trainer.train_data.corpus, [0.5, 3.0], cfg.train.seed, 0))
    share = (corpus_of == 1).mean()
    assert abs(share - 3 * n_copy / (3 * n_copy + 0.5 * n_rev)) < 0.01
    from nmtkit.training.trainer import train

    run_dir = train(cfg, quiet_console())  # and it trains, on the tagged dev set too
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000006"]
    from nmtkit.pipeline import run_recipe

    results = run_recipe(cfg, quiet_console())  # and `nmtkit run` scores the second corpus's test set too
    assert {split: r["sentences"] for split, r in results["splits"].items()} == {"dev": 4, "test": 4, "test.copy": 4}
    assert (Path(recipe["workdir"]) / "results" / "test.copy.hyp").is_file()


def test_a_split_and_a_recipe_with_other_corpora_are_refused(prepared):
    from nmtkit.data.ids import load_split
    from nmtkit.data.mixing import corpus_weights
    from nmtkit.errors import DataError

    recipe, *_ = prepared
    corpus_ids = load_split(Path(recipe["workdir"]) / "prepared" / "train.npz").corpus
    with pytest.raises(DataError, match="prepared from 2 corpora but the recipe lists no data.corpora"):
        corpus_weights(corpus_ids, [], "train.npz")
    with pytest.raises(DataError, match="prepared from one corpora but the recipe lists 2"):
        corpus_weights(None, from_dict({"data": recipe["data"]}).data.corpora, "train.npz")


# --- multilingual: --target-lang ---------------------------------------------------------------

def test_target_lang_selects_the_direction(tmp_path):
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.translate import translate_lines
    from nmtkit.modeldir import load_model_dir

    loaded = load_model_dir(tagged_model(tmp_path))
    lines = sequences(40, 99, length=4)
    reversed_lines = [" ".join(line.split()[::-1]) for line in lines]
    out = {lang: translate_lines([loaded], lines, TranslateOptions(beam_size=1, target_lang=lang, device="cpu"))
           for lang in ("r", "c")}
    exact = {lang: np.mean([hyp == ref for hyp, ref in zip(out[lang], refs)])
             for lang, refs in (("r", reversed_lines), ("c", lines))}
    assert exact["r"] >= 0.8 and exact["c"] >= 0.8, exact  # both 1.0 when written (2.7 s of training)
    assert np.mean([a == b for a, b in zip(out["r"], out["c"])]) < 0.2  # the tag, not the input, decides


def test_target_lang_errors_name_the_model_tags(tmp_path, reversal_spm, monkeypatch, capsys):
    from conftest import train_tiny

    model = tagged_model(tmp_path, steps=1)
    text = tmp_path / "in.txt"
    text.write_text("a b c\n")
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(text), "--target-lang", "fr")
    assert code == 2 and out == ""
    assert err == ("nmtkit: error: --target-lang fr: the model has no target-language tag <2fr> "
                                   "(its target languages: r, c)\n")
    plain = train_tiny(reversal_spm, tmp_path / "plain", steps=1)
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.translate import translate_lines
    from nmtkit.modeldir import load_model_dir

    with pytest.raises(ConfigError, match=r"no target-language tag <2es> \(it has none: a model of one direction\)"):
        translate_lines([load_model_dir(plain)], ["a b"], TranslateOptions(target_lang="es", device="cpu"))
    with pytest.raises(ConfigError, match="--target-lang must be a language code"):
        TranslateOptions(target_lang="e s").validate()


def test_a_later_files_corpus_may_give_training_pairs_only(tmp_path):
    from nmtkit.data.prepare import prepare

    recipe = two_corpora(tmp_path)
    recipe.pop("_sizes")
    synthetic = [(s, s) for s in sequences(30, 7)]  # e.g. a back-translated corpus: no dev or test of its own
    recipe["data"]["corpora"].append({"name": "bt", "source": "files", "tag": "<bt>",
                                      "files": {"train": write_pairs(tmp_path, "bt.train", synthetic)}})
    manifest = prepare(from_dict(recipe), quiet_console())
    assert [(c["name"], c["read"]) for c in manifest["corpora"]] == [("rev", 80), ("copy", 63), ("bt", 30)]
    first_without_heldout = {**recipe["data"], "corpora": recipe["data"]["corpora"][::-1]}
    with pytest.raises(ConfigError, match=r"^data.corpora\[0\].files.dev: missing"):  # the first corpus gives dev and test
        prepare(from_dict({**recipe, "data": first_without_heldout}), quiet_console())


@pytest.mark.parametrize("step", ["fingerprint", "read"])
def test_errors_of_a_corpus_name_its_key_in_data_corpora(tmp_path, step):
    from nmtkit.data.corpora import CorpusStream
    from nmtkit.data.prepare import prepare
    from nmtkit.errors import DataError

    recipe = two_corpora(tmp_path)
    recipe.pop("_sizes")
    missing = Path(recipe["data"]["corpora"][1]["files"]["train"]["tgt"])
    missing.unlink()
    with pytest.raises(DataError) as raised:
        if step == "fingerprint":
            prepare(from_dict(recipe), quiet_console())
        else:
            CorpusStream(from_dict(recipe).data)
    assert str(raised.value) == f"file not found: {missing} (data.corpora[1].files.train.tgt)"


def test_the_corpus_key_replaces_data_keys_only_not_paths_or_quoted_values():
    from nmtkit.data.corpora import _named
    from nmtkit.errors import DataError

    with pytest.raises(DataError) as raised:
        with _named(2):
            raise DataError("file not found: /x/data.train.de (data.files.train.de = 'data.train.de', relative to /x)")
    assert str(raised.value) == ("file not found: /x/data.train.de (data.corpora[2].files.train.de = "
                                 "'data.train.de', relative to /x)")


def test_each_directions_test_set_is_scored_in_its_own_language(tmp_path):
    """A corpus into Thai is scored a character at a time (its test set's BLEU signature says
    tok:char) while the first corpus's test and dev sets, in a language written with spaces, keep
    13a; the languages come from each corpus's tgt_lang, not from data.tgt_lang."""
    from nmtkit.pipeline import run_recipe

    rev = [(s, " ".join(s.split()[::-1])) for s in dict.fromkeys(sequences(60, 1))]
    copy = [(s, s.replace(" ", "")) for s in dict.fromkeys(sequences(60, 2))]  # no spaces: a Thai-like target
    held = sequences(8, 3, length=6)
    into_thai = {split: {"src": files["src"], "th": files["tgt"]} for split, files in
                 (("train", write_pairs(tmp_path, "copy.train", copy)),
                  ("dev", write_pairs(tmp_path, "copy.dev", [(s, s.replace(" ", "")) for s in held[:4]])),
                  ("test", write_pairs(tmp_path, "copy.test", [(s, s.replace(" ", "")) for s in held[4:]])))}
    rev_files = {"train": write_pairs(tmp_path, "rev.train", rev),
                 "dev": write_pairs(tmp_path, "rev.dev", [(s, " ".join(s.split()[::-1])) for s in held[:4]]),
                 "test": write_pairs(tmp_path, "rev.test", [(s, " ".join(s.split()[::-1])) for s in held[4:]])}
    corpora = [{"name": "rev", "source": "files", "files": rev_files, "tag": "<2r>"},
               {"name": "thai", "source": "files", "files": into_thai, "tgt_lang": "th", "tag": "<2t>"}]
    cfg = from_dict({**tiny_recipe(tmp_path / "work", vocab={"size": 24, "workers": 1},
                                   model={"d_model": 16, "ffn_dim": 32, "heads": 2, "encoder_layers": 1,
                                          "decoder_layers": 1},
                                   train={"max_steps": 2, "save_every": 2, "validate_every": 2, "threads": 1}),
                     "data": {"src_lang": "src", "tgt_lang": "tgt", "corpora": corpora}})
    assert [cfg.data.reference_language(s) for s in ("dev", "test", "test.thai")] == ["tgt", "tgt", "th"]
    back = {"name": "back", "source": "files", "files": {"train": into_thai["train"]}, "tgt_lang": "ja"}
    with_back = from_dict({"data": {"src_lang": "src", "tgt_lang": "tgt", "corpora": [*corpora, back]}})
    assert with_back.data.reference_languages() == ["tgt", "th"]  # a training-only corpus is never scored
    results = run_recipe(cfg, quiet_console())
    signatures = {split: r["bleu"]["signature"] for split, r in results["splits"].items()}
    assert set(signatures) == {"dev", "test", "test.thai"}
    assert "tok:13a" in signatures["dev"] and "tok:13a" in signatures["test"]
    assert "tok:char" in signatures["test.thai"]
