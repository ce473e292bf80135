"""Export to CTranslate2: the exported model decodes like our PyTorch engine.

Each tiny model is trained for a few seconds on the reversal task, so that its outputs
depend on the input and end in EOS; then greedy translations (pieces and scores) of the
CTranslate2 engine must equal the torch engine's, line for line.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import reversal_pairs, train_tiny
from nmtkit.config import ModelConfig
from nmtkit.decoding.translate import TranslateOptions, Translator, translate_lines
from nmtkit.errors import ConfigError
from nmtkit.translate_files import translate_file
from support.cli import run_cli
from support.text_io import quiet_console, write_lines

ctranslate2 = pytest.importorskip("ctranslate2")

from nmtkit.ctranslate2.engine import CT2Engine  # noqa: E402  (needs ctranslate2)
from nmtkit.ctranslate2.export import export_ctranslate2  # noqa: E402

VARIANTS = {
    "post-norm": dict(),
    "pre-norm": dict(pre_norm=True),
    "pre-norm-rmsnorm-swiglu-untied": dict(pre_norm=True, norm="rmsnorm", ffn="swiglu", tie_embeddings="none"),
    "learned-gelu": dict(positions="learned", ffn="gelu"),
    "rope-pre-norm": dict(positions="rope", pre_norm=True),
}


def source_lines() -> list[str]:
    lines = [s for s, _ in reversal_pairs(30, 7, length=6)]
    lines[3] = ""  # blank lines give blank translations in both engines
    lines[11] = "   "
    lines[20] = " ".join(lines[20].split()[:2])  # short inputs too
    return lines


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_translations_and_scores_match_torch(variant, reversal_spm, tmp_path):
    from nmtkit.modeldir import load_model_dir

    model_dir = train_tiny(reversal_spm, tmp_path / "model", **VARIANTS[variant])
    out = export_ctranslate2(model_dir, tmp_path / "ct2")
    lines = source_lines()
    options = TranslateOptions(beam_size=1, scores=True, device="cpu", dtype="float32", max_len_b=20)
    ours = translate_lines([load_model_dir(model_dir)], lines, options)
    ct2_options = TranslateOptions(**{**options.__dict__, "engine": "ctranslate2"})
    theirs = Translator(CT2Engine(out, ct2_options), ct2_options).translate(lines)
    assert len(theirs) == len(lines)
    assert [o.split("\t")[1] for o in ours] == [t.split("\t")[1] for t in theirs]
    assert sum(bool(o.split("\t")[1]) for o in ours) >= 25  # the model does translate
    for o, t in zip(ours, theirs):  # CTranslate2's log-probabilities, re-scored with our rule
        assert float(o.split("\t")[0]) == pytest.approx(float(t.split("\t")[0]), abs=2e-3)


def test_cli_export_and_translate_keep_one_line_per_line(reversal_spm, tmp_path):
    model_dir = train_tiny(reversal_spm, tmp_path / "model", steps=60)
    export = run_cli("export", str(model_dir), "--format", "ctranslate2", "-o", str(tmp_path / "ct2"),
                     "--quantization", "int8")
    assert export.returncode == 0, export.stderr.decode()
    meta = json.loads((tmp_path / "ct2" / "nmtkit.json").read_text())
    assert meta["quantization"] == "int8" and meta["spm"]["src"] == "spm.model"
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in source_lines()), encoding="utf-8")
    for extra in ([], ["--beam-size", "4", "--nbest", "2"], ["--sample", "--nbest", "3", "--alignments"]):
        outputs = []
        for engine, model in (("ctranslate2", tmp_path / "ct2"), ("torch", model_dir)):
            target = tmp_path / f"out.{engine}.txt"
            done = run_cli("translate", "-m", str(model), "--engine", engine, "-i", str(source), "-o", str(target),
                           "--device", "cpu", *extra)
            assert done.returncode == 0, done.stderr.decode()
            outputs.append(target.read_text(encoding="utf-8").splitlines())
        theirs, ours = outputs
        assert len(theirs) == len(ours) >= len(source_lines())  # nbest lines per input, one for a blank input
        if "--nbest" in extra:  # the same input index on every line
            assert [line.split("\t")[0] for line in theirs] == [line.split("\t")[0] for line in ours]
        if "--alignments" in extra:
            assert all(line.count("\t") == 3 for line in theirs)
    refused = run_cli("translate", "-m", str(tmp_path / "ct2"), "-i", str(source), "--device", "cpu", "--workers", "2")
    assert (refused.returncode, refused.stderr.decode()) == (2, "nmtkit: error: --workers applies to the torch engine: "
                                                                "the CTranslate2 engine searches one batch at a time on "
                                                                "every thread\n")


def test_info_on_an_export_tells_of_its_source_only_while_the_source_holds_the_exported_weights(reversal_spm,
                                                                                                   tmp_path):
    model_dir = train_tiny(reversal_spm, tmp_path / "model", steps=5)
    export_ctranslate2(model_dir, tmp_path / "ct2")
    meta = json.loads((model_dir / "config.json").read_text())
    assert json.loads((tmp_path / "ct2" / "nmtkit.json").read_text())["source_weights_sha256"] == meta["weights_sha256"]
    same = run_cli("info", str(tmp_path / "ct2"), "--json")
    assert same.returncode == 0 and "warning" not in same.stderr.decode(), same.stderr.decode()
    assert json.loads(same.stdout)["export"]["source_model"] == str(model_dir.resolve())
    (model_dir / "config.json").write_text(json.dumps({**meta, "weights_sha256": "0" * 64}))  # retrained since
    moved = run_cli("info", str(tmp_path / "ct2"), "--json")
    assert moved.returncode == 0, moved.stderr.decode()
    assert "holds other weights than were exported: showing the export's own metadata" in moved.stderr.decode()
    card = json.loads(moved.stdout)
    assert card["model_dir"] == str(tmp_path / "ct2") and card["architecture"] == json.loads(same.stdout)["architecture"]


def test_unsupported_models_and_plain_directories_are_one_line_errors(reversal_spm, tmp_path):
    from nmtkit.data.vocab import Vocab
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import save_model_dir

    cfg = ModelConfig(arch="rnn", embed_dim=8, hidden_dim=8)
    size = len(Vocab(reversal_spm))
    rnn_dir = save_model_dir(build_model(cfg, size, size), cfg, tmp_path / "rnn", reversal_spm, reversal_spm)
    refused = run_cli("export", str(rnn_dir), "-o", str(tmp_path / "out"))
    assert refused.returncode == 2
    assert refused.stderr.decode().count("\n") == 1 and "only Transformer" in refused.stderr.decode()
    assert not (tmp_path / "out").exists()
    plain = run_cli("translate", "-m", str(rnn_dir), "--engine", "ctranslate2", input="a b\n")
    assert plain.returncode == 2 and "nmtkit export" in plain.stderr.decode()
    bad = run_cli("export", str(rnn_dir), "-o", str(tmp_path / "out"), "--quantization", "int3")
    assert bad.returncode == 2 and "--quantization" in bad.stderr.decode()


@pytest.mark.parametrize("setting, named", [(dict(positions="alibi"), "model.positions=alibi"),
                                            (dict(moe_experts=2, moe_top_k=1), "model.moe_experts=2"),
                                            (dict(key_dim=4), "model.key_dim=4")])
def test_settings_ctranslate2_cannot_hold_are_refused_by_name(setting, named, reversal_spm, tmp_path):
    from nmtkit.data.vocab import Vocab
    from nmtkit.models.build import build_model
    from nmtkit.modeldir import save_model_dir

    cfg = ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1, **setting)
    size = len(Vocab(reversal_spm))
    model_dir = save_model_dir(build_model(cfg, size, size), cfg, tmp_path / "m", reversal_spm, reversal_spm)
    refused = run_cli("export", str(model_dir), "-o", str(tmp_path / "out"))
    err = refused.stderr.decode()
    assert refused.returncode == 2 and err.count("\n") == 1 and named in err, err
    assert not (tmp_path / "out").exists()


def test_ctranslate2_alignments_do_not_depend_on_the_lines_around_them(reversal_spm, tmp_path):
    model_dir = train_tiny(reversal_spm, tmp_path / "model", steps=60)
    out = export_ctranslate2(model_dir, tmp_path / "ct2")
    lines = [" ".join(s.split()[:3 + i % 5]) for i, (s, _) in enumerate(reversal_pairs(80, 5, length=7))]
    options = TranslateOptions(beam_size=2, alignments=True, device="cpu", dtype="float32", max_len_b=12,
                               engine="ctranslate2")
    translator = Translator(CT2Engine(out, options), options)
    together = translator.translate(lines)
    assert together == [translator.translate([line])[0] for line in lines]
    assert sum("-" in line.split("\t")[-1] for line in together) >= len(lines) // 2  # alignments there


def test_ctranslate2_beam_search_chooses_at_the_length_limit_as_free_and_refuses_scored(reversal_spm, tmp_path):
    """CTranslate2 stops at the length limit without an EOS: its beam search chooses what our
    eos_at_limit free chooses, so asking it for scored is refused (in serve too, where a request
    may ask for a beam); greedy chooses the same under either rule, so there scored is taken (its
    scores: tests/test_forced_eos.py)."""
    from nmtkit.modeldir import load_model_dir
    from nmtkit.translate_files import CT2_EOS_AT_LIMIT, resolve_options

    model_dir = train_tiny(reversal_spm, tmp_path / "model", steps=60)
    out = export_ctranslate2(model_dir, tmp_path / "ct2")
    lines = [line for line in source_lines() if line.strip()]
    limit = dict(beam_size=4, max_len_a=0.0, max_len_b=3, device="cpu", dtype="float32")
    ours = {rule: translate_lines([load_model_dir(model_dir)], lines, TranslateOptions(**limit, eos_at_limit=rule))
            for rule in ("free", "scored")}
    ct2_options = TranslateOptions(**limit, engine="ctranslate2")  # the model's own rule: scored
    theirs = Translator(CT2Engine(out, ct2_options), ct2_options).translate(lines)
    assert theirs == ours["free"] != ours["scored"]  # outputs reach the limit, where the rules differ
    export = [str(out)]
    with pytest.raises(ConfigError, match=CT2_EOS_AT_LIMIT):
        resolve_options(export, {"eos_at_limit": "scored", "beam_size": 4})
    assert resolve_options(export, {"eos_at_limit": "scored", "beam_size": 1}).eos_at_limit == "scored"
    with pytest.raises(ConfigError, match=CT2_EOS_AT_LIMIT):  # serve --max-beam 4: a request may ask for 4
        resolve_options(export, {"eos_at_limit": "scored", "beam_size": 1}, largest_beam=4)
    assert resolve_options(export, {}, largest_beam=4).eos_at_limit == "scored"  # the model's own: not a request


@pytest.fixture(scope="module")
def exported(tmp_path_factory, reversal_spm):
    """A tiny trained model and its CTranslate2 export, for the tests below."""
    root = tmp_path_factory.mktemp("exported")
    model_dir = train_tiny(reversal_spm, root / "model", steps=60)
    return model_dir, export_ctranslate2(model_dir, root / "ct2")


def both_engines(exported, lines: list[str], **settings) -> tuple[list[str], list[str]]:
    """``lines`` translated by the torch engine and by CTranslate2, under the same settings."""
    from nmtkit.modeldir import load_model_dir

    model_dir, export = exported
    options = TranslateOptions(device="cpu", dtype="float32", **settings)
    ours = translate_lines([load_model_dir(model_dir)], lines, options)
    ct2_options = dataclasses.replace(options, engine="ctranslate2")
    return ours, Translator(CT2Engine(export, ct2_options), ct2_options).translate(lines)


def fields(outputs: list[str]) -> list[list[str]]:
    return [row.split("\t") for output in outputs for row in output.split("\n")]


@pytest.mark.parametrize("settings", [
    dict(beam_size=1, scores=True, max_len_a=0.0, max_len_b=2, min_len=5),  # a limit below --min-len
    dict(beam_size=2, nbest=2, eos_at_limit="free", max_len_a=0.0, max_len_b=2, min_len=5),
    dict(beam_size=1, scores=True, max_len_a=0.0, max_len_b=0),  # a limit of 0: only the forced EOS
    dict(beam_size=1, scores=True, max_len_a=0.0, max_len_b=0, eos_at_limit="free"),
    dict(sample=True, nbest=2, max_len_a=0.0, max_len_b=0),
])
def test_ctranslate2_decodes_at_short_length_limits_as_torch(exported, settings):
    """A length limit below --min-len was a ValueError in CTranslate2 (the limit wins, as in our
    search), and a limit of 0 printed 0.0000 where torch scores the forced EOS (and one sample
    where --nbest asked for 2): the same outputs and scores now."""
    lines = [s for s, _ in reversal_pairs(4, 6, length=5)] + [""]
    ours, theirs = both_engines(exported, lines, **settings)
    assert [row[-1] for row in fields(ours)] == [row[-1] for row in fields(theirs)]  # the texts
    assert [float(row[-2]) for row in fields(ours)] == pytest.approx([float(row[-2]) for row in fields(theirs)],
                                                                     abs=2e-3)


def test_ctranslate2_samples_every_chunk_under_any_seed_and_a_resumed_run_alike(exported, tmp_path, monkeypatch):
    """CTranslate2 takes an unsigned 32-bit seed: every chunk after the first (its seed a 63-bit
    digest) and any --seed from 2 ** 32 raised TypeError. A chunk's seed is taken modulo
    2 ** 32 - 1, so a run killed between chunks resumes to the uninterrupted run's samples, and
    --seed 4294967295 is not CTranslate2's "a random seed" (2 ** 32 - 1) either. Sampled hot, so
    that a random seed would show."""
    _, export = exported
    lines = [s for s, _ in reversal_pairs(6, 4, length=6)]
    source, out = write_lines(tmp_path / "in.txt", lines), tmp_path / "out.txt"
    real = Translator.translate
    for seed in (3, 2**40 + 3, 2**32 - 1):
        options = TranslateOptions(sample=True, seed=seed, chunk_lines=2, max_len_b=12, device="cpu",
                                   dtype="float32", engine="ctranslate2", temperature=3.0)
        translate_file([str(export)], str(source), str(out), options, quiet_console())
        whole = out.read_bytes()
        assert whole.count(b"\n") == len(lines)
        calls = []

        def crash_at_third_chunk(self, chunk, **kw):
            calls.append(chunk)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(self, chunk, **kw)

        monkeypatch.setattr(Translator, "translate", crash_at_third_chunk)
        with pytest.raises(KeyboardInterrupt):
            translate_file([str(export)], str(source), str(out), options, quiet_console())
        monkeypatch.setattr(Translator, "translate", real)
        out.unlink()
        translate_file([str(export)], str(source), str(out), options, quiet_console())  # resumes from chunk 2
        assert out.read_bytes() == whole


def test_a_reseeded_translator_is_dropped_before_its_reload_and_a_failed_reload_is_one_line(exported, monkeypatch):
    """Reloading beside the old translator held two copies of the model (twice the memory, on a
    GPU too); a reload that fails (out of memory) is the engine's one-line load error."""
    from nmtkit.errors import CheckpointError

    _, export = exported
    seeds = []
    monkeypatch.setattr(ctranslate2, "set_random_seed", seeds.append)
    options = TranslateOptions(sample=True, seed=2**32 - 1, max_len_b=12, device="cpu", dtype="float32",
                               engine="ctranslate2")
    engine = CT2Engine(export, options)
    Translator(engine, options).translate([s for s, _ in reversal_pairs(2, 4, length=6)])
    held = []

    def out_of_memory():
        held.append(engine.ct2)
        raise RuntimeError("out of memory\nwhile allocating")

    engine.load = out_of_memory
    with pytest.raises(CheckpointError) as failed:
        engine.reseed(2**33)
    assert str(failed.value) == f"{export}: CTranslate2 cannot load this export (out of memory)"
    assert held == [None] and seeds == [0, 2]  # 2 ** 32 - 1 and 2 ** 33, modulo 2 ** 32 - 1


def test_ctranslate2_takes_a_top_k_past_the_vocabulary_as_torch_does(exported):
    """--topk above the vocabulary keeps every piece, as --topk 0 does (CTranslate2 raised)."""
    everything = both_engines(exported, [s for s, _ in reversal_pairs(5, 8, length=6)], sample=True, seed=4,
                              nbest=2, max_len_b=12)
    assert both_engines(exported, [s for s, _ in reversal_pairs(5, 8, length=6)], sample=True, seed=4, nbest=2,
                        max_len_b=12, topk=10**6) == everything
