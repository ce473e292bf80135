"""Fine-tuning: ``vocab.from`` reuses a SentencePiece model instead of training
one, and ``train.init_from`` starts a new run from another model's weights."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from conftest import reversal_pairs, tiny_recipe, tiny_sentences, write_prepared
from nmtkit.config import from_dict, load_config
from nmtkit.errors import ConfigError, DataError
from nmtkit.specials import UNK
from support.cli import cli_in_process
from support.text_io import quiet_console

MODEL = dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0)


def write_files(root: Path, train: list[str], dev: list[str]) -> dict:
    """data.files for a toy task (target: the source's words reversed), languages en and xx."""
    files = {}
    for split, sources in (("train", train), ("dev", dev), ("test", dev)):
        files[split] = {}
        for lang, lines in (("en", sources), ("xx", [" ".join(s.split()[::-1]) for s in sources])):
            path = root / f"{split}.{lang}"
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            files[split][lang] = str(path)
    return files


def prepared_recipe(root: Path, train: list[str], **vocab) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    return {"name": root.name, "workdir": str(root / "work"),
            "data": {"source": "files", "src_lang": "en", "tgt_lang": "xx",
                     "files": write_files(root, train, tiny_sentences(10, seed=9))},
            "vocab": {"size": 40, "workers": 1, **vocab}}


def run_prepare(recipe: dict) -> tuple[dict, str]:
    from nmtkit.data.prepare import prepare

    console = quiet_console()
    return prepare(from_dict(recipe), console), console.file.getvalue()


@pytest.fixture(scope="module")
def general(tmp_path_factory) -> Path:
    """A prepared directory whose SentencePiece model the tests reuse."""
    root = tmp_path_factory.mktemp("general")
    run_prepare(prepared_recipe(root, tiny_sentences(300, seed=1)))
    return root / "work" / "prepared"


def test_vocab_from_a_model_directory_encodes_with_its_model_and_counts_unknown_pieces(general, tmp_path):
    from nmtkit.data.ids import load_split
    from nmtkit.data.vocab import Vocab
    from nmtkit.modeldir import save_model_dir
    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model

    vocab = Vocab(general / "spm.model")
    model_dir = save_model_dir(build_model(ModelConfig(**MODEL), len(vocab), len(vocab)), ModelConfig(**MODEL),
                               tmp_path / "general-model", general / "spm.model", general / "spm.model")
    domain = [s.replace("cat", "Zebra qüick") for s in tiny_sentences(60, seed=2)]  # Z, ü, q: unseen letters
    summary, printed = run_prepare(prepared_recipe(tmp_path / "domain", domain, **{"from": str(model_dir)}))
    out = tmp_path / "domain" / "work" / "prepared"
    assert (out / "spm.model").read_bytes() == (general / "spm.model").read_bytes()
    assert not (out / "spm.vocab").exists()
    for split in ("train", "dev"):
        ids = load_split(out / f"{split}.npz")
        text = gzip.decompress((out / "train.en.gz").read_bytes()) if split == "train" else (out / "dev.en").read_bytes()
        lines = text.decode("utf-8").splitlines()
        expected = vocab.encode_batch(lines)
        assert [ids.pair(i)[0].tolist() for i in range(len(ids))] == expected
        assert summary["unknown"][split]["src"] == sum(piece == UNK for row in expected for piece in row)
    assert summary["unknown"]["train"]["src"] > 0
    assert summary["vocab"]["from"] == str(model_dir.resolve())
    assert f"reused from {model_dir.resolve()}" in printed and "unknown pieces (<unk>): train" in printed


def test_spm_model_type_is_read_from_the_model_file(tmp_path):
    """The algorithm comes from the ModelProto itself (no protobuf dependency), as SentencePiece wrote it."""
    import sentencepiece as spm

    from nmtkit.data.vocab import spm_model_type

    text = tmp_path / "text.txt"
    text.write_text("".join(line + "\n" for line in tiny_sentences(200, seed=3)))
    for kind in ("unigram", "bpe", "char", "word"):
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / kind), vocab_size=30,
                                       model_type=kind, minloglevel=2, hard_vocab_limit=False)
        assert spm_model_type(tmp_path / f"{kind}.model") == kind
    (tmp_path / "bad.model").write_bytes(b"\x0a\x80")  # a varint cut short
    with pytest.raises(DataError, match="not a SentencePiece model"):
        spm_model_type(tmp_path / "bad.model")


def test_vocab_from_must_fit_the_recipe(general, tmp_path):
    from nmtkit.data.vocab import reused_models

    assert reused_models(general, joint=True) == (general / "spm.model", general / "spm.model")
    with pytest.raises(ConfigError, match=r"^vocab.joint=false but .* has one joint model; set vocab.joint: true$"):
        reused_models(general, joint=False)
    with pytest.raises(ConfigError, match=r"^vocab.size is 48 but .*spm.model \(vocab.from\) has 40 pieces; "
                                          r"set vocab.size: 40$"):
        run_prepare(prepared_recipe(tmp_path / "d", tiny_sentences(30), size=48, **{"from": str(general)}))
    with pytest.raises(ConfigError, match=r"^vocab.type is bpe but .*spm.model \(vocab.from\) is a unigram model; "
                                          r"set vocab.type: unigram$"):
        run_prepare(prepared_recipe(tmp_path / "t", tiny_sentences(30), type="bpe", **{"from": str(general)}))
    run_prepare(prepared_recipe(tmp_path / "u", tiny_sentences(30), type="unigram", **{"from": str(general)}))
    with pytest.raises(ConfigError, match=r"^vocab.type is bpe but"):  # after a good prepare: not "up to date"
        run_prepare(prepared_recipe(tmp_path / "u", tiny_sentences(30), type="bpe", **{"from": str(general)}))
    with pytest.raises(ConfigError, match="^vocab.character_coverage applies when SentencePiece is trained"):
        from_dict({"data": {"source": "files"}, "vocab": {"from": "x", "character_coverage": 0.99}})
    cfg = load_config(None, ["data.source=files", f"vocab.from={general}"])
    assert cfg.vocab.from_ == str(general) and cfg.to_dict()["vocab"]["from"] == str(general)
    assert from_dict(cfg.to_dict()) == cfg


# --- train.init_from ---------------------------------------------------------------------------

@pytest.fixture
def finetune(tmp_path) -> tuple[Path, dict]:
    """A prepared reversal task and a model directory (random weights, on the same vocabulary)."""
    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import save_model_dir

    work = tmp_path / "work"
    prepared = write_prepared(work, reversal_pairs(120, 0, length=6), reversal_pairs(10, 1, length=6))
    recipe = tiny_recipe(work, model={**MODEL, "max_positions": 64},
                         train={"max_steps": 4, "save_every": 2, "validate_every": 2, "log_every": 1,
                                "threads": 1, "init_from": str(tmp_path / "general")})
    cfg = from_dict(recipe)
    torch.manual_seed(11)
    from nmtkit.data.vocab import Vocab

    size = len(Vocab(prepared / "spm.model"))
    save_model_dir(build_model(cfg.model, size, size), cfg.model, tmp_path / "general", prepared / "spm.model",
                   prepared / "spm.model", {"step": 700, "recipe": "general"})
    return tmp_path / "general", recipe


def test_init_from_starts_at_the_source_weights_with_a_fresh_optimizer_and_step(finetune):
    from nmtkit.data.vocab import Vocab
    from nmtkit.modeldir import WEIGHTS, read_weights, state_dict_for_save
    from nmtkit.models.build import build_model
    from nmtkit.training.startup import prepared_vocabs
    from nmtkit.training.trainer import Trainer

    source, recipe = finetune
    cfg = from_dict(recipe)
    src_path, tgt_path, src_vocab, tgt_vocab = prepared_vocabs(cfg)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, len(src_vocab), len(tgt_vocab))
    trainer = Trainer(cfg, quiet_console(), model, torch.device("cpu"), torch.float32, src_path, tgt_path,
                      src_vocab, tgt_vocab, Path(recipe["workdir"]) / "train")
    trainer._resume()  # what run() does before the first step
    expected = read_weights(source / WEIGHTS)
    got = state_dict_for_save(trainer.model)
    assert set(got) == set(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    assert trainer.state.step == 0 and not trainer.optimizer.state_dict()["state"]
    assert trainer.meta["init_from"] == {"path": str(source.resolve()), "step": 700, "recipe": "general",
                                         "weights_sha256": json.loads((source / "config.json").read_text())[
                                             "weights_sha256"]}


def test_a_fine_tuning_run_resumes_exactly_from_its_own_checkpoints(finetune, tmp_path):
    from nmtkit.card import model_card
    from nmtkit.modeldir import WEIGHTS, read_weights
    from nmtkit.training.checkpoint import checkpoint_dirs, read_trainer_state
    from nmtkit.training.trainer import train

    source, recipe = finetune
    straight = json.loads(json.dumps(recipe))
    straight["workdir"] = str(tmp_path / "straight")
    shutil.copytree(Path(recipe["workdir"]) / "prepared", tmp_path / "straight" / "prepared")
    train(from_dict(straight), quiet_console())
    train(from_dict({**recipe, "train": {**recipe["train"], "max_steps": 2}}), quiet_console())
    shutil.rmtree(source)  # the second session resumes from the run's checkpoint, never from init_from
    run_dir = train(from_dict(recipe), quiet_console())
    final, reference = checkpoint_dirs(run_dir)[-1], checkpoint_dirs(tmp_path / "straight" / "train")[-1]
    assert final.name == reference.name == "step_00000004"
    assert read_trainer_state(final).step == 4
    ours, theirs = read_weights(final / WEIGHTS), read_weights(reference / WEIGHTS)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    card = model_card(final)
    assert card["init_from"]["path"] == str(source.resolve()) and card["init_from"]["step"] == 700


def test_init_from_refuses_another_architecture_or_vocabulary_in_one_line(finetune, tmp_path, monkeypatch, capsys):
    from nmtkit.training.trainer import train

    source, recipe = finetune
    path = tmp_path / "other.yaml"
    other = {**recipe, "model": {**recipe["model"], "d_model": 32, "decoder_layers": 2}}
    path.write_text(yaml.safe_dump(other), encoding="utf-8")
    code, _, err = cli_in_process(monkeypatch, capsys, "train", str(path), "--dry-run")
    assert code == 2
    assert err == (f"nmtkit: error: train.init_from: {source} is another architecture: "
                                   f"model.d_model (32 here, 16 there), model.decoder_layers (2 here, 1 there); "
                                   f"fine-tuning keeps the model's architecture\n")
    console = quiet_console()
    train(from_dict(recipe), console, dry_run=True)  # dropout may change; the table names the source
    assert f"{source.resolve()} (step 700)" in console.file.getvalue()
    prepared = Path(recipe["workdir"]) / "prepared"
    write_prepared(prepared.parent, reversal_pairs(120, 5, length=7), reversal_pairs(10, 1, length=6), vocab_size=15)
    with pytest.raises(ConfigError, match=r"^train.init_from: .* has another src vocabulary \(spm.model\) than the "
                                          r"prepared data .*; prepare with vocab.from: "):
        train(from_dict(recipe), quiet_console(), dry_run=True)


def test_prepare_goes_on_once_the_reused_vocabulary_is_gone(general, tmp_path):
    """The copies in prepared/ are checked against the spm stamp, so the general model may be moved
    away after the first prepare (as docs/adapting.md says); anything else still needs it."""
    source = tmp_path / "general-copy"
    shutil.copytree(general, source)
    recipe = prepared_recipe(tmp_path / "domain", tiny_sentences(30), **{"from": str(source)})
    assert run_prepare(recipe)[0]["steps"]["spm"] == "done"
    shutil.rmtree(source)
    summary, _ = run_prepare(recipe)
    assert summary["steps"] == {"fetch": "up to date", "spm": "up to date", "encode": "up to date"}
    assert summary["vocab"]["from"] == str(source.resolve())
    with pytest.raises(DataError, match=r"^directory not found: .*general-copy \(vocab.from\)$"):
        run_prepare({**recipe, "vocab": {**recipe["vocab"], "size": 48}})  # another size: the model is needed
    with pytest.raises(DataError, match=r"^directory not found: .*general-copy \(vocab.from\)$"):
        run_prepare({**recipe, "vocab": {**recipe["vocab"], "joint": False}})  # another layout
    prepared = tmp_path / "domain" / "work" / "prepared"
    (prepared / "spm.model").write_bytes((prepared / "spm.model").read_bytes())  # touched: copied again
    with pytest.raises(DataError, match=r"^directory not found: .*general-copy \(vocab.from\)$"):
        run_prepare(recipe)


def test_two_plain_models_with_equal_pieces_are_not_one_vocabulary(general, tmp_path):
    """tie_embeddings=all over separate models needs id maps (an imported vocabulary): a model
    directory with two plain SentencePiece models is refused by average and translate
    (modeldir.joint_vocab), so prepare and train refuse it first, even when the piece lists agree."""
    from nmtkit.training.startup import prepared_vocabs

    twins = tmp_path / "twins"
    twins.mkdir()
    for name in ("spm.src.model", "spm.tgt.model"):
        shutil.copy(general / "spm.model", twins / name)
    recipe = prepared_recipe(tmp_path / "domain", tiny_sentences(30), joint=False, **{"from": str(twins)})
    recipe["model"] = {"tie_embeddings": "all"}
    with pytest.raises(ConfigError) as err:
        run_prepare(recipe)
    assert str(err.value) == (f"model.tie_embeddings=all needs one vocabulary, but {twins} (vocab.from) has two; "
                              f"set model.tie_embeddings: decoder or none")
    run_prepare({**recipe, "model": {"tie_embeddings": "decoder"}})  # prepared untied, then trained tied
    prepared = tmp_path / "domain" / "work" / "prepared"
    with pytest.raises(ConfigError) as err:
        prepared_vocabs(from_dict(recipe))
    assert str(err.value) == (f"model.tie_embeddings=all needs one vocabulary, but {prepared} has two SentencePiece "
                              f"models (spm.src.model, spm.tgt.model) without id maps; set model.tie_embeddings: "
                              f"decoder or none")
    untied = from_dict({**recipe, "model": {"tie_embeddings": "decoder"}})
    assert prepared_vocabs(untied)[0] == prepared / "spm.src.model"
