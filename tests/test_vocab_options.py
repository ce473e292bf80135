"""vocab.byte_fallback, vocab.normalization and vocab.split_digits: each reaches SentencePiece,
and what existed before them keeps its meaning: a recipe saying byte_fallback: false keeps the
very stamps an older nmtkit wrote (its prepared directory is reused as it is), settings recorded
without the key mean false, and sweep digests do not move; the new default is a difference."""
from __future__ import annotations

import io
import json

import pytest

from nmtkit.config import Config, from_dict, load_config
from nmtkit.runtime.console import NmtConsole
from nmtkit.data import prepare as prep
from nmtkit.data.identity import prepared_settings, settings_changes, with_defaults
from nmtkit.data.vocab import Vocab, train_spm
from nmtkit.errors import ConfigError
from nmtkit.specials import UNK
from support.planted import recipe, splits  # noqa: F401 (fixtures)


def run(recipe, *overrides):  # noqa: F811
    console = NmtConsole(0, file=io.StringIO(), width=200)
    summary = prep.prepare(load_config(recipe, list(overrides)), console)
    return summary, console.file.getvalue()


def stamp_inputs(recipe_path) -> dict:
    workdir = json.loads(recipe_path.read_text())["workdir"]
    return json.loads((__import__("pathlib").Path(workdir) / "prepared" / "stamps" / "spm.json").read_text())["inputs"]


def test_byte_fallback_false_keeps_the_stamp_an_older_nmtkit_wrote(recipe):  # noqa: F811
    summary, printed = run(recipe, "vocab.byte_fallback=false")
    # the spm step's inputs as nmtkit computed them before these keys existed: nothing added
    assert sorted(stamp_inputs(recipe)["vocab"]) == ["character_coverage", "input_sentence_size", "joint", "size",
                                                     "type"]
    assert summary["vocab"]["byte_fallback"] is False and "no byte fallback" in printed
    assert run(recipe, "vocab.byte_fallback=false")[0]["steps"]["spm"] == "up to date"
    # at size 60 "auto" is off too: the same model, the same stamp
    assert run(recipe)[0]["steps"]["spm"] == "up to date"
    on, printed = run(recipe, "vocab.byte_fallback=true", "vocab.size=300")
    assert on["steps"]["spm"] == "done" and on["vocab"]["byte_fallback"] is True and ", byte fallback" in printed
    assert stamp_inputs(recipe)["vocab"]["byte_fallback"] is True


@pytest.mark.parametrize("size, expected", [(300, False), (1023, False), (1024, True), (8000, True)])
def test_auto_turns_byte_fallback_on_for_real_vocabularies(size, expected):
    cfg = load_config(None, ["data.source=sword", f"vocab.size={size}"])
    assert cfg.vocab.byte_fallback == "auto" and cfg.vocab.uses_byte_fallback() is expected


def test_settings_recorded_before_the_key_meant_false():
    recorded = prepared_settings(load_config(None, ["data.source=sword", "vocab.byte_fallback=false"]))
    del recorded["vocab"]["byte_fallback"], recorded["vocab"]["normalization"], recorded["vocab"]["split_digits"]
    pinned = load_config(None, ["data.source=sword", "vocab.byte_fallback=false"])
    assert settings_changes(with_defaults(recorded), prepared_settings(pinned)) == []
    new_default = load_config(None, ["data.source=sword"])
    assert settings_changes(with_defaults(recorded), prepared_settings(new_default)) == \
        ['vocab.byte_fallback: false -> "auto"']


def test_sweep_digests_move_only_for_the_new_default():
    from nmtkit.sweep.spec import changed_settings

    assert "byte_fallback" not in changed_settings(load_config(None, ["data.source=sword", "vocab.byte_fallback=false"]))
    assert changed_settings(load_config(None, ["data.source=sword"]))["vocab"] == {"byte_fallback": "auto"}
    assert Config.legacy_tree()["vocab"]["byte_fallback"] is False and Config().vocab.byte_fallback == "auto"


def test_a_resumed_run_from_before_the_key_is_compared_with_false(tmp_path):
    from nmtkit.runlog import saved_section

    cfg = Config()
    assert saved_section({"vocab": {"size": 8000}}, "vocab", cfg)["byte_fallback"] is False
    assert saved_section({"vocab": {"byte_fallback": "auto"}}, "vocab", cfg)["byte_fallback"] == "auto"


def test_normalization_and_split_digits_reach_sentencepiece(tmp_path):
    words = "the quick brown fox jumps over lazy dogs while seven wizards quietly hex jovial kings".split()
    texts = [f"ｆｕｌｌ width {n} and Ⅻ in 2026 numbers {n * 7} " + " ".join(words[(n + i) % len(words)] for i in range(6))
             for n in range(300)]
    models = {}
    for name, options in {"nfkc": {}, "identity": {"normalization": "identity"},
                          "digits": {"split_digits": True}, "folded": {"normalization": "nmt_nfkc_cf"}}.items():
        train_spm(texts, tmp_path / f"{name}.model", vocab_size=50, **options)
        models[name] = Vocab(tmp_path / f"{name}.model")
    assert models["nfkc"].normalize("ｆｕｌｌ Ⅻ") == "full XII"
    assert models["identity"].normalize("ｆｕｌｌ Ⅻ") == "ｆｕｌｌ Ⅻ"
    assert models["folded"].normalize("Full WIDTH") == "full width"
    digit_pieces = [p for p in models["digits"].pieces(models["digits"].encode("2026 678")) if p.strip("▁")]
    assert digit_pieces == list("2026678")
    longest = max(len(p.strip("▁")) for p in models["nfkc"].pieces(models["nfkc"].encode("2026")))
    assert longest > 1  # without split_digits the year seen in every line is a piece of several digits


def test_the_recipe_keys_reach_prepare(recipe):  # noqa: F811
    summary, _ = run(recipe, "vocab.normalization=identity", "vocab.split_digits=true")
    assert stamp_inputs(recipe)["vocab"] == {**stamp_inputs(recipe)["vocab"], "normalization": "identity",
                                             "split_digits": True}
    assert summary["steps"]["spm"] == "done"


@pytest.mark.parametrize("key, value", [("byte_fallback", "true"), ("byte_fallback", "false"),
                                        ("normalization", "identity"), ("split_digits", "true")])
def test_a_reused_vocabulary_decides_its_own_options(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"vocab.{key} applies when SentencePiece is trained, but vocab.from"):
        load_config(None, ["data.source=sword", f"vocab.from={tmp_path}", f"vocab.{key}={value}"])


@pytest.mark.parametrize("override, message", [
    ("vocab.byte_fallback=sometimes", "vocab.byte_fallback: 'sometimes' is not one of auto, true, false"),
    ("vocab.normalization=nfc", "vocab.normalization: 'nfc' is not one of nmt_nfkc, nfkc, nmt_nfkc_cf, identity"),
    ("eval.tokenize=moses", "eval.tokenize: 'moses' is not one of \"\", 13a, intl, zh"),
    ("eval.metrics=bleu,meteor", "eval.metrics: unknown metric 'meteor'"),
    ("eval.comet_batch_size=0", "eval.comet_batch_size must be"),
])
def test_bad_values_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError) as raised:
        from_dict({"data": {"source": "sword"}, **_nested(override)})
    assert message in str(raised.value) and "\n" not in str(raised.value)


def _nested(override: str) -> dict:
    key, value = override.split("=", 1)
    section, name = key.split(".")
    import yaml

    return {section: {name: yaml.safe_load(value)}}


def test_a_directory_with_commas_and_lines_over_sentencepieces_limit_train(tmp_path):
    """SentencePiece splits a string input on commas and skips lines over 4,192 bytes by default:
    a model path with commas still trains, and text made only of long lines (paragraphs, CJK)
    still gives a model that knows its characters."""
    directory = tmp_path / "runs,seed=1"
    long_lines = [" ".join(["alpha beta gamma δέλτα 中文"] * 200) + f" {i}" for i in range(40)]  # ~7 kB each
    assert min(len(line.encode("utf-8")) for line in long_lines) > 4192
    train_spm(long_lines, directory / "spm.model", vocab_size=32)  # 31 pieces hold its characters, 34 at most fit
    vocab = Vocab(directory / "spm.model")
    ids = vocab.encode("中文 δέλτα 7")
    assert UNK not in ids and vocab.decode(ids) == "中文 δέλτα 7"


def test_a_vocabulary_too_small_for_the_characters_says_to_raise_it(tmp_path):
    from nmtkit.errors import DataError

    text = ["".join(chr(0x4E00 + (i * 7 + j) % 60) for j in range(12)) for i in range(200)]  # 60 characters
    with pytest.raises(DataError) as err:
        train_spm(text, tmp_path / "spm.model", vocab_size=30)
    message = str(err.value)
    assert "raise vocab.size" in message and "smaller vocab.size" not in message and "\n" not in message


def test_lines_too_long_to_survive_cleaning_are_left_out_of_sentencepiece(tmp_path, monkeypatch):
    """SentencePiece's training time grows with the square of its longest line: a line cleaning
    will drop (more than 64 non-space characters per allowed piece) is not given to it."""
    import nmtkit.data.vocab as vocab_module

    seen = {}

    def capture(seed, options):
        seen["lines"] = open(options["input"][0], encoding="utf-8").read().splitlines()
        seen["max_sentence_length"] = options["max_sentence_length"]

    monkeypatch.setattr(vocab_module, "_train", capture)
    monkeypatch.setattr(vocab_module.os, "replace", lambda *args: None)
    normal = [f"the cat sees the dog {i}" for i in range(20)]
    at_bound = "a" * 640 + " " + " " * 5000  # 640 non-space characters: 10 pieces of 64 could hold them
    over = " ".join(["a"] * 641)  # 641 pieces at least
    train_spm([*normal, at_bound, over], tmp_path / "spm.model", vocab_size=32, max_pieces=10)
    assert seen["lines"] == [*normal, at_bound]
    assert seen["max_sentence_length"] == len(at_bound) + 1
    train_spm([*normal, over], tmp_path / "spm.model", vocab_size=32)  # no limit: every line goes in
    assert seen["lines"] == [*normal, over]


def test_prepare_gives_sentencepiece_the_cleaning_limit(recipe, monkeypatch):  # noqa: F811
    given = []
    real = prep.train_spm
    monkeypatch.setattr(prep, "train_spm", lambda *args, **kwargs: given.append(kwargs["max_pieces"]) or
                        real(*args, **kwargs))
    run(recipe, "data.clean.max_len=100")
    assert given == [100]
