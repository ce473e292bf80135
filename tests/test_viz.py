"""Views: training curves, attention maps, the model card, and TensorBoard mirroring."""
from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch

from conftest import reversal_pairs, tiny_recipe, write_prepared
from nmtkit.config import ModelConfig, TrainConfig, from_dict
from nmtkit.errors import ConfigError, NmtkitError
from nmtkit.runtime.console import get_console
from support.cli import run_cli

pytest.importorskip("matplotlib")

BLOCK_TENSORBOARD = {"torch.utils.tensorboard": None, "tensorboard": None}  # `import` of these raises ImportError


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG signature and IHDR chunk."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def _train(workdir: Path, **train) -> Path:
    from nmtkit.training.trainer import train as run_train

    settings = {**dict(max_steps=10, log_every=5, validate_every=5, save_every=5, best_metric="bleu"), **train}
    return run_train(from_dict(tiny_recipe(workdir, train=settings)), get_console(-1))




@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_thread) -> Path:
    """A 10-step run with dev loss and BLEU, trained with TensorBoard unimportable (it is off)."""
    workdir = tmp_path_factory.mktemp("viz")
    write_prepared(workdir, reversal_pairs(300, 0, length=5), reversal_pairs(20, 1, length=5))
    manifest = {"format": 1, "source": "files", "splits": {s: {"pairs": n} for s, n in
                                                            (("train", 300), ("dev", 20), ("test", 20))},
                "tokens": {"train": {"src": 3000, "tgt": 3000}}, "cleaning": {"read": 300, "kept": 300}}
    (workdir / "prepared" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.MonkeyPatch.context() as patch:
        for name, module in BLOCK_TENSORBOARD.items():
            patch.setitem(sys.modules, name, module)
        return _train(workdir)


# -- training curves ---------------------------------------------------------------------------

def test_curves_of_two_runs_are_a_png_of_the_asked_size(tiny_run, tmp_path):
    from matplotlib.image import imread

    from nmtkit.viz.curves import plot_curves, run_labels

    other = tmp_path / "other" / "train"
    shutil.copytree(tiny_run, other)
    out = plot_curves([tiny_run, other], tmp_path / "curves.png", size=(640, 480))
    assert png_size(out) == (640, 480)
    assert imread(out).shape[:2] == (480, 640)
    assert len(set(run_labels([tiny_run, other]))) == 2


def test_every_run_of_a_large_sweep_gets_its_own_colour_and_line_style():
    from nmtkit.viz.curves import run_styles

    styles = run_styles(26)  # table3-mini's rows
    assert len(set(styles)) == 26
    assert styles[0] == ("C0", "-") and styles[10] == ("C0", "--") and styles[25] == ("C5", ":")


def test_curves_against_time_via_cli(tiny_run, tmp_path):
    out = tmp_path / "time.png"
    done = run_cli("plot", str(tiny_run), "-o", str(out), "--x", "time", "--size", "500x300")
    assert done.returncode == 0, done.stderr.decode()
    assert png_size(out) == (500, 300)
    bad = run_cli("plot", str(tiny_run), "-o", str(out), "--x", "epochs")
    assert bad.returncode == 2 and len(bad.stderr.decode().strip().splitlines()) == 1


def test_validation_time_is_interpolated_from_training_records():
    from nmtkit.viz.curves import series

    records = [{"type": "train", "step": 10, "loss": 3.0, "train_seconds": 5.0},
               {"type": "valid", "step": 15, "dev_loss": 2.0},
               {"type": "train", "step": 20, "loss": 2.0, "train_seconds": 10.0},
               {"type": "valid", "step": 30, "dev_loss": 1.5}]
    assert series(records, "valid", "dev_loss", "step") == ([15.0, 30.0], [2.0, 1.5])
    assert series(records, "valid", "dev_loss", "time") == ([7.5, 15.0], [2.0, 1.5])  # after the last: same rate
    assert series(records, "valid", "dev_bleu", "time") == ([], [])


# -- attention -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sentence(tiny_run):
    from nmtkit.modeldir import load_model_dir
    from nmtkit.viz.attention import sentence_attention

    loaded = load_model_dir(tiny_run / "best")
    return loaded, sentence_attention(loaded, "a b c d", beam_size=2)


def test_attention_is_targets_by_sources_and_rows_sum_to_one(sentence):
    _, att = sentence
    layers, heads, targets, sources = att.maps.shape
    assert (layers, heads) == (2, 2)
    assert (targets, sources) == (len(att.target_pieces), len(att.source_pieces)) and targets >= 1
    torch.testing.assert_close(att.maps.sum(-1), torch.ones(layers, heads, targets))
    assert att.matrix().shape == att.matrix(1, 2).shape == (targets, sources)
    assert att.heads(1).shape == (heads, targets, sources)
    with pytest.raises(ConfigError, match="2 attention layer"):
        att.matrix(3)


def test_teacher_forced_maps_equal_the_search_attention(sentence):
    """The default map (last layer, mean of heads) is what decode_step reports step by step."""
    from nmtkit.decoding.options import SearchSettings
    from nmtkit.decoding.search import beam_search

    loaded, att = sentence
    ids = loaded.src_vocab.encode("a b c d")
    src = torch.tensor([ids])
    best = beam_search(loaded.model, src, src.ne(0), SearchSettings(beam_size=2, need_attn=True))[0][0]
    assert loaded.tgt_vocab.pieces(best.tokens) == att.target_pieces
    torch.testing.assert_close(att.matrix(), best.attention.float(), atol=1e-5, rtol=1e-5)


def test_attention_pngs(sentence, tmp_path):
    from matplotlib.image import imread

    from nmtkit.viz.attention import plot_attention

    _, att = sentence
    one = plot_attention(att, tmp_path / "one.png", size=(420, 360))
    assert png_size(one) == (420, 360)
    grid = plot_attention(att, tmp_path / "grid.png", layer=1, grid=True, size=(800, 400))
    assert png_size(grid) == (800, 400)
    auto = plot_attention(att, tmp_path / "auto.png", head=1)
    assert imread(auto).ndim == 3


def test_attention_json_via_cli(tiny_run):
    done = run_cli("attention", "-m", str(tiny_run / "best"), "a b c d", "--format", "json", "--head", "2")
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    matrix = torch.tensor(out["attention"])
    assert matrix.shape == (len(out["target_pieces"]), len(out["source_pieces"]))
    torch.testing.assert_close(matrix.sum(1), torch.ones(matrix.size(0)), atol=1e-4, rtol=0)
    assert out["layer"] == 2 and out["head"] == 2


def test_attention_json_goes_to_o_and_refuses_size(tiny_run, tmp_path):
    """With --format json, -o and --size were accepted and ignored (the JSON went to stdout):
    -o now receives the JSON, replaced whole as an image is, and --size, an image's, is refused."""
    model = str(tiny_run / "best")
    out = tmp_path / "maps.json"
    out.write_text("old\n")
    done = run_cli("attention", "-m", model, "a b c d", "--format", "json", "-o", str(out))
    assert done.returncode == 0 and done.stdout == b"", done.stderr.decode()
    assert done.stderr.decode().replace("\n", "") == f"wrote {out}"  # the console wraps a long path
    printed = run_cli("attention", "-m", model, "a b c d", "--format", "json")
    assert out.read_text(encoding="utf-8") == printed.stdout.decode()
    assert [p.name for p in tmp_path.iterdir()] == ["maps.json"]  # no temporary file left beside it
    refused = [run_cli("attention", "-m", model, "a b c d", "--format", "json", "--size", "100x100", "-o",
                       str(tmp_path / "x.gif")),
               run_cli("attention", "-m", model, "a b c d", "--format", "json", "-o", str(out / "x.json"))]
    assert [(r.returncode, r.stdout, r.stderr.decode()) for r in refused] == [
        (2, b"", "nmtkit: error: --size sets the image's pixels: --format json draws no image; leave it out\n"),
        (2, b"", f"nmtkit: error: -o {out / 'x.json'}: {out} is not a directory\n")]
    assert [p.name for p in tmp_path.iterdir()] == ["maps.json"]


def test_attention_translates_with_the_model_s_saved_decode_settings(tiny_run, tmp_path):
    """The maps are those of the translation `translate` gives: the model's saved length limit
    applies (here 2 pieces), and --target-lang is checked as translate checks it."""
    from nmtkit.storage.checksums import read_manifest, write_manifest

    model = tmp_path / "model"
    shutil.copytree(tiny_run / "best", model)
    meta = json.loads((model / "config.json").read_text())
    meta["decode"].update(max_len_a=0.0, max_len_b=2, min_len=0)
    (model / "config.json").write_text(json.dumps(meta))
    write_manifest(model, read_manifest(model, NmtkitError))
    outputs = {}
    for name, path in (("saved", model), ("default", tiny_run / "best")):
        done = run_cli("attention", "-m", str(path), "a b c d", "--format", "json")
        assert done.returncode == 0, done.stderr.decode()
        outputs[name] = json.loads(done.stdout)
        translated = run_cli("translate", "-m", str(path), "--dtype", "float32", input="a b c d\n")  # attention's
        assert outputs[name]["translation"] == translated.stdout.decode().rstrip("\n")
    assert len(outputs["saved"]["target_pieces"]) <= 2 < len(outputs["default"]["target_pieces"])
    tagged = run_cli("attention", "-m", str(model), "a b c d", "--format", "json", "--target-lang", "de")
    assert tagged.returncode == 2 and "--target-lang de: the model has no target-language tag <2de>" in tagged.stderr.decode()


def test_grid_json_has_every_head(sentence):
    from nmtkit.viz.attention import attention_json

    _, att = sentence
    out = attention_json(att, layer=1, grid=True)
    assert out["head"] == "all" and torch.tensor(out["attention"]).shape == att.heads(1).shape


def test_rnn_attention_comes_from_the_decoder_state(tiny_spm):
    from nmtkit.data.vocab import Vocab
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import LoadedModel
    from nmtkit.viz.attention import sentence_attention

    cfg = ModelConfig(arch="rnn", embed_dim=16, hidden_dim=16, encoder_layers=1, decoder_layers=1, dropout=0.0)
    vocab = Vocab(tiny_spm)
    torch.manual_seed(0)
    model = build_model(cfg, len(vocab), len(vocab)).eval()
    att = sentence_attention(LoadedModel(model, cfg, vocab, vocab, {}), "the cat sat", beam_size=2)
    assert att.maps.shape == (1, 1, len(att.target_pieces), len(att.source_pieces))
    torch.testing.assert_close(att.matrix().sum(1), torch.ones(len(att.target_pieces)))
    with pytest.raises(ConfigError, match="1 attention head"):
        att.matrix(head=2)


# -- model card ------------------------------------------------------------------------------------

def test_info_json_fields(tiny_run):
    done = run_cli("info", str(tiny_run / "best"), "--json")
    assert done.returncode == 0, done.stderr.decode()
    card = json.loads(done.stdout)
    assert card["architecture"]["arch"] == "transformer" and card["architecture"]["d_model"] == 32
    assert card["parameters"] == 43_264
    assert card["vocabulary"] == {"source": 16, "target": 16, "joint": True}
    assert card["languages"] == {"source": "src", "target": "tgt"}
    assert card["checkpoint"]["step"] in (5, 10) and "dev_loss" in card["checkpoint"]
    assert card["training"]["steps"] == 10 and "best_dev_bleu" in card["training"]
    assert card["recipe"]["name"] == "tiny" and card["recipe"]["settings"]["model.d_model"] == 32
    assert card["data"]["splits"]["train"]["pairs"] == 300


def test_the_card_fills_keys_a_saved_config_leaves_out_as_loading_does():
    """A config.json from before a key existed (or written by hand) loads with the defaults; the
    card shows the same, instead of failing on the missing key."""
    from nmtkit.card import architecture
    from nmtkit.config import model_config_from_dict

    saved = {"arch": "transformer", "d_model": 16, "ffn_dim": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1}
    loaded = model_config_from_dict(saved, joint_vocab=True)
    card = architecture(saved)
    assert (card["norm"], card["ffn"], card["positions"]) == (loaded.norm, loaded.ffn, loaded.positions)
    assert card["summary"] == (f"d 16, ffn 32 ({loaded.ffn}), heads 2, layers 1+1, post-norm {loaded.norm}, "
                               f"{loaded.positions} positions")


def test_info_table_has_no_colour_codes_off_a_terminal(tiny_run, capsys):
    from nmtkit.card import info_command

    info_command(tiny_run / "best", as_json=False)
    out = capsys.readouterr().out
    assert "43,264" in out and "\x1b[" not in out


def test_info_of_a_lone_model_dir_leaves_out_the_run(tiny_run, tmp_path):
    from nmtkit.card import model_card

    lone = shutil.copytree(tiny_run / "best", tmp_path / "model")
    card = model_card(lone)
    assert card["parameters"] == 43_264 and "training" not in card and "recipe" not in card


# -- TensorBoard -----------------------------------------------------------------------------------

def test_tensorboard_is_off_by_default(tiny_run):
    assert TrainConfig().tensorboard is False
    assert not (tiny_run / "tensorboard").exists()  # and the fixture trained with it unimportable


def test_tensorboard_missing_is_one_clear_error(tiny_run, tmp_path, monkeypatch):
    shutil.copytree(tiny_run.parent / "prepared", tmp_path / "prepared")
    for name, module in BLOCK_TENSORBOARD.items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(NmtkitError, match=r"needs the tensorboard package: pip install 'nmtkit\[tensorboard\]'"):
        _train(tmp_path, max_steps=5, best_metric="loss", tensorboard=True)
    assert not (tmp_path / "train").exists()  # refused before a model was built or a step taken


def test_tensorboard_mirrors_metrics(tiny_run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    shutil.copytree(tiny_run.parent / "prepared", tmp_path / "prepared")
    run_dir = _train(tmp_path, max_steps=5, best_metric="loss", tensorboard=True)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        for key in ("loss", "lr", "dev_loss"):
            if key in record:
                (scalar,) = [e for e in events.Scalars(f"{record['type']}/{key}") if e.step == record["step"]]
                assert scalar.value == pytest.approx(record[key], rel=1e-6)
