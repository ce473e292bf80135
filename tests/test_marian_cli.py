"""`nmtkit import` through the command line: every command on the imported model, and bad
input (another model type, missing files, mismatched shapes, damaged or pickled weights, an
unreachable Hub, an unknown target language) as one line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from support.cli import cli_in_process
from support.marian_models import make_marian

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian") / "hf", codes=(">>fra<<", ">>deu<<"), seed=5)


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory) -> Path:
    from nmtkit.pretrained.marian_import import import_marian

    return import_marian(str(hf_dir), tmp_path_factory.mktemp("imported") / "model")


def copy_of(hf_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(hf_dir, tmp_path / "copy"))


def one_line_error(monkeypatch, capsys, *args) -> str:
    code, out, err = cli_in_process(monkeypatch, capsys, *args)
    assert code != 0 and out == ""
    assert err.startswith("nmtkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_import_then_translate_info_and_target_language(hf_dir, tmp_path, monkeypatch, capsys):
    code, _, err = cli_in_process(monkeypatch, capsys, "import", str(hf_dir), "-o", str(tmp_path / "m"))
    assert code == 0, err
    code, out, _ = cli_in_process(monkeypatch, capsys, "info", str(tmp_path / "m"), "--json")
    card = json.loads(out)
    assert card["imported_from"]["format"] == "marian"
    assert card["imported_from"]["source"] == str(hf_dir.resolve())
    assert card["target_languages"] == ["fra", "deu"]
    assert card["vocabulary"]["joint"] is True
    assert card["architecture"]["summary"].endswith("(silu), heads 2, layers 2+2, post-norm layernorm, "
                                                    "sinusoidal positions (halves), output bias")
    text = tmp_path / "in.txt"
    text.write_text("the dog\nred cat sat\n\n", encoding="utf-8")
    for lang in ("fra", "deu"):
        code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(tmp_path / "m"), "-i", str(text),
                                        "--target-lang", lang, "--beam-size", "2", "--max-len-b", "6")
        assert code == 0, err
        assert len(out.split("\n")) == 4 and out.split("\n")[2] == ""  # one line per input, a blank one blank
    err = one_line_error(monkeypatch, capsys, "translate", "-m", str(tmp_path / "m"), "-i", str(text),
                         "--target-lang", "spa")
    assert ">>spa<<" in err and "fra, deu" in err


def test_import_creates_the_output_s_parent_directories(hf_dir, tmp_path, monkeypatch, capsys):
    """-o models/NAME in a fresh checkout: the missing parents are made, as export makes them."""
    out = tmp_path / "models" / "en-de"
    code, _, err = cli_in_process(monkeypatch, capsys, "import", str(hf_dir), "-o", str(out))
    assert code == 0, err
    assert (out / "config.json").is_file() and (out / "spm.src.model").is_file()


def test_target_language_chooses_the_code_token(imported):
    """--target-lang fra translates as the text with >>fra<< written first (Marian's convention)."""
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.translate import translate_lines
    from nmtkit.modeldir import load_model_dir

    loaded = load_model_dir(imported)
    lines = ["the red dog", "a blue cat sat"]
    base = dict(beam_size=1, max_len_a=0.0, max_len_b=8, device="cpu", dtype="float32")
    by_flag = translate_lines([loaded], lines, TranslateOptions(**base, target_lang="fra"))
    by_text = translate_lines([loaded], [f">>fra<< {line}" for line in lines], TranslateOptions(**base))
    assert by_flag == by_text
    assert loaded.src_vocab.pieces(loaded.src_vocab.encode(">>fra<< the"))[0] == ">>fra<<"


def test_another_model_type_is_refused(hf_dir, tmp_path, monkeypatch, capsys):
    src = copy_of(hf_dir, tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    assert "'bart' model, not MarianMT" in one_line_error(monkeypatch, capsys, "import", str(src), "-o",
                                                         str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_missing_vocab_json_is_refused(hf_dir, tmp_path, monkeypatch, capsys):
    src = copy_of(hf_dir, tmp_path)
    (src / "vocab.json").unlink()
    assert "no vocab.json" in one_line_error(monkeypatch, capsys, "import", str(src), "-o", str(tmp_path / "m"))


def test_mismatched_shapes_are_refused(hf_dir, tmp_path, monkeypatch, capsys):
    """A vocabulary one piece longer than the embedding table (pad still last, ids moved with it)."""
    src = copy_of(hf_dir, tmp_path)
    vocab = json.loads((src / "vocab.json").read_text())
    pad = vocab.pop("<pad>")
    vocab.update({"\u2581extra": pad, "<pad>": pad + 1})
    (src / "vocab.json").write_text(json.dumps(vocab))
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "pad_token_id": pad + 1, "decoder_start_token_id": pad + 1}))
    err = one_line_error(monkeypatch, capsys, "import", str(src), "-o", str(tmp_path / "m"))
    assert "mismatched shapes" in err and f"{pad + 1} rows" in err and f"{pad + 2} pieces" in err


def test_damaged_safetensors_is_refused(hf_dir, tmp_path, monkeypatch, capsys):
    src = copy_of(hf_dir, tmp_path)
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert "not a readable safetensors file" in one_line_error(monkeypatch, capsys, "import", str(src), "-o",
                                                               str(tmp_path / "m"))


class _Payload:
    """Unpickling this object would run a shell command (what a malicious .bin does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (shutil.copyfile, (__file__, str(self.marker)))


def test_pickled_weights_never_run_code(hf_dir, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    src = copy_of(hf_dir, tmp_path)
    weights = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({**weights, "payload": _Payload(marker)}, src / "pytorch_model.bin")
    err = one_line_error(monkeypatch, capsys, "import", str(src), "-o", str(tmp_path / "m"))
    assert "not a plain tensor file, refused" in err
    assert not marker.exists()
    torch.save(weights, src / "pytorch_model.bin")  # plain tensors: imported, the same model
    code, _, err = cli_in_process(monkeypatch, capsys, "import", str(src), "-o", str(tmp_path / "m"))
    assert code == 0, err


def test_hub_id_offline_and_not_cached_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.chdir(tmp_path)
    err = one_line_error(monkeypatch, capsys, "import", "Helsinki-NLP/opus-mt-en-de", "-o", str(tmp_path / "m"))
    assert "cannot fetch Helsinki-NLP/opus-mt-en-de from the Hugging Face Hub" in err


def hub_repo(hf_dir: Path, out: Path, weights: str) -> Path:
    """A copy of ``hf_dir`` as a Hub repository holding ``weights``: model.safetensors and
    pytorch_model.bin (the same tensors), or pytorch_model.bin alone."""
    from safetensors.torch import load_file

    shutil.copytree(hf_dir, out)
    torch.save(load_file(str(out / "model.safetensors")), out / "pytorch_model.bin")
    if weights == "bin-only":
        (out / "model.safetensors").unlink()
    return out


@pytest.mark.parametrize("weights", ["both", "bin-only"])
def test_hub_fetch_asks_for_the_bin_only_without_safetensors(hf_dir, tmp_path, monkeypatch, weights):
    """One weight file is read, so one is downloaded: a stand-in Hub records the patterns asked for."""
    import huggingface_hub

    from nmtkit.pretrained.marian_import import HUB_FILES, import_marian

    repo, snapshot, asked = hub_repo(hf_dir, tmp_path / "repo", weights), tmp_path / "snapshot", []

    def snapshot_download(repo_id, allow_patterns):
        asked.append(sorted(allow_patterns))
        snapshot.mkdir(exist_ok=True)
        for name in allow_patterns:
            if (repo / name).is_file():
                shutil.copyfile(repo / name, snapshot / name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    import_marian("owner/opus-mt-xx-yy", tmp_path / "m")
    without_bin = sorted(set(HUB_FILES) - {"pytorch_model.bin"})
    assert asked == ([without_bin] if weights == "both" else [without_bin, sorted(HUB_FILES)])
    assert (snapshot / "pytorch_model.bin").is_file() == (weights == "bin-only")


@pytest.mark.parametrize("weights", ["both", "bin-only"])
def test_a_cached_hub_snapshot_imports_offline(hf_dir, tmp_path, monkeypatch, weights):
    """Offline, huggingface_hub's cached copy is used, whichever weight file it holds."""
    from huggingface_hub import constants

    from nmtkit.modeldir import load_model_dir
    from nmtkit.pretrained.marian_import import import_marian

    commit, cached = "0123456789abcdef0123456789abcdef01234567", tmp_path / "hub" / "models--owner--opus-mt-xx-yy"
    snapshot = hub_repo(hf_dir, cached / "snapshots" / commit, weights)  # the cache's layout: refs name snapshots
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = load_model_dir(import_marian("owner/opus-mt-xx-yy", tmp_path / "m"))
    assert loaded.meta["imported_from"]["revision"] == commit
    assert sorted(loaded.meta["imported_from"]["files"]) == sorted(path.name for path in snapshot.iterdir())


def test_ctranslate2_export_of_an_imported_model_translates_the_same(imported, tmp_path, monkeypatch, capsys):
    pytest.importorskip("ctranslate2")
    text = tmp_path / "in.txt"
    text.write_text("the red dog\na blue cat sat\nquickly\n", encoding="utf-8")
    code, _, err = cli_in_process(monkeypatch, capsys, "export", str(imported), "--format", "ctranslate2",
                                  "-o", str(tmp_path / "ct2"))
    assert code == 0, err
    outputs = {}
    for name, model in (("torch", imported), ("ct2", tmp_path / "ct2")):
        code, outputs[name], err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(model), "-i", str(text),
                                                  "--target-lang", "deu", "--beam-size", "2", "--max-len-b", "6",
                                                  "--dtype", "float32")  # the export's (auto is bf16 on bf16 CPUs)
        assert code == 0, err
    assert outputs["torch"] == outputs["ct2"] and len(outputs["torch"].splitlines()) == 3


@pytest.mark.parametrize("flags", [["--dtype", "int8"], ["--dtype", "bf16"], ["--nbest", "2", "--scores"],
                                   ["--sample", "--seed", "2"], ["--alignments"]])
def test_translate_options_on_an_imported_model(imported, tmp_path, monkeypatch, capsys, flags):
    text = tmp_path / "in.txt"
    text.write_text("the red dog\n\nquickly\n", encoding="utf-8")
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(imported), "-i", str(text),
                                    "--max-len-b", "5", *flags)
    assert code == 0, err
    assert len(out.splitlines()) == 3 * (2 if "--nbest" in flags else 1)


def test_serve_target_lang_on_an_imported_model(imported):
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.translate import translate_lines
    from nmtkit.modeldir import load_model_dir
    from nmtkit.serving.app import create_app, serving_card
    from nmtkit.serving.batcher import Batcher
    from nmtkit.serving.requests import Limits
    from nmtkit.translate_files import open_engine

    options = TranslateOptions(device="cpu", dtype="float32", beam_size=1, max_len_a=0.0, max_len_b=6)
    limits = Limits(max_body_bytes=4000, max_lines=6, max_line_chars=60, max_beam=4)
    batcher = Batcher(open_engine([str(imported)], options), options, 0.0, options.batch_tokens)
    lines = ["the red dog", "a blue cat"]
    with TestClient(create_app(batcher, serving_card([str(imported)], options, limits, 0, batcher.engine.description), limits)) as client:
        answer = client.post("/translate", json={"texts": lines, "target_lang": "fra"})
        refused = client.post("/translate", json={"texts": lines, "target_lang": "spa"})
    loaded = load_model_dir(imported)
    assert answer.json()["translations"] == translate_lines([loaded], [f">>fra<< {x}" for x in lines], options)
    assert refused.status_code == 400 and ">>spa<<" in refused.json()["error"]


def test_every_command_line_in_the_docs_parses():
    """docs/pretrained.md: each `nmtkit ...` line is a command with options it has."""
    import typer.main

    from nmtkit.cli import app

    group = typer.main.get_command(app)
    text = (Path(__file__).resolve().parent.parent / "docs" / "pretrained.md").read_text(encoding="utf-8")
    blocks = text.split("```")[1::2]  # the code blocks
    lines = [line.split() for block in blocks for line in block.splitlines() if line.startswith("nmtkit ")]
    assert len(lines) >= 6
    for words in lines:
        command = group.get_command(None, words[1])
        assert command is not None, words
        command.make_context(words[1], words[2:])  # raises on an unknown option or a missing argument


def test_a_marian_directory_given_as_a_model_says_to_import_it(hf_dir, tmp_path, monkeypatch, capsys):
    text = tmp_path / "in.txt"
    text.write_text("the dog\n", encoding="utf-8")
    err = one_line_error(monkeypatch, capsys, "translate", "-m", str(hf_dir), "-i", str(text))
    assert "Hugging Face MarianMT directory" in err and f"nmtkit import {hf_dir} -o MODEL" in err
