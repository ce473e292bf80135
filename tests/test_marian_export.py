"""`nmtkit export --format marian`: transformers loads the directory and computes what nmtkit
computes; import then export gives back the original tensors; what Marian cannot express is
one line naming the setting."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_sentences
from support.cli import cli_in_process
from support.marian_models import make_marian

from nmtkit.config import DecodeConfig, ModelConfig
from nmtkit.modeldir import load_model_dir, save_model_dir
from nmtkit.models.build import build_model
from nmtkit.pretrained.marian_export import export_marian
from nmtkit.pretrained.marian_import import import_marian
from nmtkit.specials import BOS, EOS, PAD

pytest.importorskip("transformers")


@pytest.mark.parametrize("shape", [dict(), dict(shared=False, activation="relu", scale=False)],
                         ids=["shared", "separate"])
def test_import_then_export_gives_back_the_same_tensors(tmp_path, shape):
    from safetensors.torch import load_file

    original = make_marian(tmp_path / "hf", **shape)
    exported = export_marian(import_marian(str(original), tmp_path / "model"), tmp_path / "back")
    before, after = load_file(str(original / "model.safetensors")), load_file(str(exported / "model.safetensors"))
    assert sorted(before) == sorted(after)
    for name in before:
        assert torch.equal(before[name], after[name]), name
    for name in ("vocab.json", "target_vocab.json"):
        if (original / name).exists():
            assert json.loads((exported / name).read_text()) == json.loads((original / name).read_text())
    assert sharing(exported) == sharing(original)
    assert_same_generation(original, exported)


def test_a_shared_untied_model_comes_back_with_separate_vocabularies(tmp_path):
    """share_encoder_decoder_embeddings true, tie_word_embeddings false imports as tie_embeddings
    none, so it goes back with separate vocabularies, each the original vocab.json, and its encoder,
    decoder and output tables bit for bit, without model.shared (transformers 5.24 reads the
    encoder's and decoder's own tables for such a model); generate gives the same ids."""
    from safetensors.torch import load_file

    original = make_marian(tmp_path / "hf", activation="gelu", tied=False)
    exported = export_marian(import_marian(str(original), tmp_path / "model"), tmp_path / "back")
    before, after = load_file(str(original / "model.safetensors")), load_file(str(exported / "model.safetensors"))
    assert sorted(set(before) - set(after)) == ["model.shared.weight"] and set(after) <= set(before)
    for name in after:
        assert torch.equal(before[name], after[name]), name
    assert sharing(original) == (True, False) and sharing(exported) == (False, False)
    vocab = json.loads((original / "vocab.json").read_text())
    assert json.loads((exported / "vocab.json").read_text()) == vocab
    assert json.loads((exported / "target_vocab.json").read_text()) == vocab
    assert_same_generation(original, exported)


def sharing(directory: Path) -> tuple[bool, bool]:
    """config.json's (share_encoder_decoder_embeddings, tie_word_embeddings)."""
    config = json.loads((directory / "config.json").read_text())
    return config["share_encoder_decoder_embeddings"], config["tie_word_embeddings"]


def assert_same_generation(original: Path, exported: Path) -> None:
    """MarianTokenizer reads sources alike from both directories, and generate gives the same ids."""
    from transformers import MarianMTModel, MarianTokenizer

    lines = tiny_sentences(5, 3)
    ours, theirs = (MarianTokenizer.from_pretrained(d)(lines, return_tensors="pt", padding=True)
                    for d in (exported, original))
    assert torch.equal(ours.input_ids, theirs.input_ids)
    a, b = (MarianMTModel.from_pretrained(d).eval().generate(**theirs, num_beams=2, max_new_tokens=8)
            for d in (original, exported))
    assert torch.equal(a, b)


def native_model(tmp_path: Path, spm: Path, decode: DecodeConfig | None = None, **model) -> Path:
    cfg = ModelConfig(**{**dict(d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=1, dropout=0.0,
                                max_positions=64), **model})
    torch.manual_seed(0)
    net = build_model(cfg, 40, 40)
    with torch.no_grad():
        for param in net.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    meta = {"decode": dataclasses.asdict(decode)} if decode is not None else None
    return save_model_dir(net, cfg, tmp_path / "native", spm, spm, meta)


def test_generation_config_carries_beam_and_minimum_length_not_the_length_penalty(tmp_path, tiny_spm):
    """num_beams is decode.beam_size and min_new_tokens decode.min_len (both block EOS before that
    many output pieces); lenpen is GNMT's, which generate's length_penalty is not, so none is
    written. Imported again, the export has the same beam and minimum."""
    from transformers import GenerationConfig

    native_model(tmp_path, tiny_spm, DecodeConfig(beam_size=3, min_len=2, lenpen=0.8))
    exported = export_marian(tmp_path / "native", tmp_path / "marian")
    written = json.loads((exported / "generation_config.json").read_text())
    assert {key: written[key] for key in ("num_beams", "min_new_tokens", "max_length")} == \
        {"num_beams": 3, "min_new_tokens": 2, "max_length": 64}
    assert "length_penalty" not in written and "min_length" not in written
    loaded = GenerationConfig.from_pretrained(exported)
    assert (loaded.num_beams, loaded.min_new_tokens) == (3, 2)
    again = load_model_dir(import_marian(str(exported), tmp_path / "again")).meta["decode"]
    assert (again["beam_size"], again["min_len"], again["max_len_b"]) == (3, 2, 62)


@pytest.mark.parametrize("model", [dict(), dict(ffn="gelu", tie_embeddings="none")], ids=["paper", "gelu-untied"])
def test_a_trained_model_computes_the_same_in_transformers(tmp_path, tiny_spm, model):
    """The paper's interleaved sinusoids go out as Marian's layout with the model dimensions
    permuted: transformers' log-probabilities equal ours on the same ids (MarianTokenizer's
    source ends in </s>, which nmtkit's own sources do not; fed the same ids, the same numbers)."""
    from transformers import MarianMTModel, MarianTokenizer

    loaded = load_model_dir(native_model(tmp_path, tiny_spm, **model))
    exported = export_marian(tmp_path / "native", tmp_path / "marian")
    hf, tokenizer = MarianMTModel.from_pretrained(exported).eval(), MarianTokenizer.from_pretrained(exported)
    sources, targets = tiny_sentences(4, 1), tiny_sentences(4, 2)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
    for row, line in enumerate(sources):
        assert batch.input_ids[row][batch.attention_mask[row].bool()].tolist() == loaded.src_vocab.encode(line) + [EOS]
    tgt_in = torch.cat([torch.full((len(targets), 1), BOS), batch.labels[:, :-1]], 1)
    tgt_in = tgt_in.masked_fill(tgt_in.eq(BOS) & (torch.arange(tgt_in.size(1)) > 0), PAD)  # HF pads labels with <pad>
    with torch.no_grad():
        theirs = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).logits
        ours = loaded.model(batch.input_ids.masked_fill(~batch.attention_mask.bool(), PAD),
                            batch.attention_mask.bool(), tgt_in)
    keep = batch.labels.ne(BOS)  # exported <pad> is our BOS id
    torch.testing.assert_close(theirs.log_softmax(-1)[keep], ours.log_softmax(-1)[keep], atol=1e-4, rtol=0)


def test_an_exported_nmtkit_model_imports_again_and_computes_the_same(tmp_path, tiny_spm):
    """export then import of a model nmtkit trained: its padding row travels as a piece of the
    Marian vocabulary and comes back as our PAD (not a second added row); the re-imported model
    reads sources with </s>, as transformers does, and computes what the original computes on them."""
    native = load_model_dir(native_model(tmp_path, tiny_spm))
    export_marian(tmp_path / "native", tmp_path / "marian")
    again = load_model_dir(import_marian(str(tmp_path / "marian"), tmp_path / "again"))
    for source, target in zip(tiny_sentences(4, 1), tiny_sentences(4, 2)):
        src = again.src_vocab.encode(source)
        assert src == native.src_vocab.encode(source) + [EOS]
        src_t = torch.tensor([src])
        tgt_in = torch.tensor([[BOS] + native.tgt_vocab.encode(target)])
        with torch.no_grad():
            ours, theirs = (loaded.model(src_t, torch.ones_like(src_t, dtype=torch.bool), tgt_in).log_softmax(-1)
                            for loaded in (native, again))
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("setting", [dict(pre_norm=True), dict(ffn="swiglu"), dict(positions="learned")])
def test_what_marian_cannot_express_is_one_line(tmp_path, tiny_spm, monkeypatch, capsys, setting):
    native_model(tmp_path, tiny_spm, **setting)
    code, out, err = cli_in_process(monkeypatch, capsys, "export", str(tmp_path / "native"), "--format", "marian",
                                    "-o", str(tmp_path / "out"))
    key, value = next(iter(setting.items()))
    assert code != 0 and err.count("\n") == 1 and f"model.{key}={str(value).lower()}" in err, err
    assert not (tmp_path / "out").exists()


def test_export_replaces_only_its_own_directories(tmp_path, tiny_spm, monkeypatch, capsys):
    native_model(tmp_path, tiny_spm)
    args = ["export", str(tmp_path / "native"), "--format", "marian", "-o", str(tmp_path / "out")]
    for _ in range(2):  # a second export replaces the first
        code, _, err = cli_in_process(monkeypatch, capsys, *args)
        assert code == 0, err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, err = cli_in_process(monkeypatch, capsys, *args[:-1], str(tmp_path / "mine"))
    assert code == 2 and "nmtkit replaces only" in err and (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    code, _, err = cli_in_process(monkeypatch, capsys, *args, "--quantization", "int8")
    assert code == 2 and "--quantization is for --format ctranslate2" in err


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_a_hostile_export_record_in_the_output_is_refused_in_one_line(tmp_path, tiny_spm, monkeypatch, capsys, kind):
    """A named pipe as nmtkit-marian.json would wait for a writer forever; '[' 200,000 times
    deep would raise RecursionError: either way the directory is not an export of ours."""
    import os

    from nmtkit.pretrained.marian_export import META

    native_model(tmp_path, tiny_spm)
    out = tmp_path / "out"
    out.mkdir()
    if kind == "fifo":
        os.mkfifo(out / META)
    else:
        (out / META).write_text("[" * 200000)
    code, _, err = cli_in_process(monkeypatch, capsys, "export", str(tmp_path / "native"), "--format", "marian",
                                  "-o", str(out))
    assert (code, err) == (2, f"nmtkit: error: -o {out} exists and is not a MarianMT export of nmtkit (no readable "
                              f"{META}): nmtkit replaces only a directory it wrote; choose another -o or move it "
                              f"away\n")
    assert [p.name for p in out.iterdir()] == [META]
