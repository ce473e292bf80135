"""`nmtkit import` of MarianMT models: log-probabilities and translations equal transformers'
on tiny random models of several shapes, and bad input is one line."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from conftest import tiny_sentences
from support.marian_models import make_marian

from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.translate import translate_lines
from nmtkit.modeldir import load_model_dir
from nmtkit.pretrained.marian_import import import_marian
from nmtkit.specials import BOS, EOS, PAD
from nmtkit.translate_files import saved_decode_settings

transformers = pytest.importorskip("transformers")

SHAPES = {"shared-swish-scaled": dict(),
          "separate-relu-unscaled": dict(shared=False, activation="relu", scale=False),
          "shared-gelu-untied": dict(activation="gelu", tied=False),
          "multilingual": dict(codes=(">>fra<<", ">>deu<<"))}


def hf_pair(directory: Path):
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(directory).eval(), MarianTokenizer.from_pretrained(directory)


def our_logprobs(loaded, sources: list[str], targets: list[str]) -> list[torch.Tensor]:
    """Teacher-forced log p(y_t) of each target piece and its EOS, in one padded batch."""
    src_ids = [loaded.src_vocab.encode(s) for s in sources]
    tgt_ids = [loaded.tgt_vocab.encode(t) + [EOS] for t in targets]
    src = torch.full((len(sources), max(map(len, src_ids))), PAD)
    tgt_in = torch.full((len(targets), max(map(len, tgt_ids))), PAD)
    tgt_out = tgt_in.clone()
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        src[row, :len(s)] = torch.tensor(s)
        tgt_in[row, :len(t)] = torch.tensor([BOS] + t[:-1])
        tgt_out[row, :len(t)] = torch.tensor(t)
    with torch.no_grad():
        lprobs = loaded.model(src, src.ne(PAD), tgt_in).log_softmax(-1).gather(-1, tgt_out[..., None])[..., 0]
    return [lprobs[row, :len(t)] for row, t in enumerate(tgt_ids)]


@pytest.mark.parametrize("shape", SHAPES)
def test_teacher_forced_logprobs_equal_marian(tmp_path, shape):
    hf_dir = make_marian(tmp_path / "hf", **SHAPES[shape])
    loaded = load_model_dir(import_marian(str(hf_dir), tmp_path / "model"))
    hf, tokenizer = hf_pair(hf_dir)
    code = ">>deu<< " if shape == "multilingual" else ""
    sources = [code + line for line in tiny_sentences(8, 1)]
    targets = tiny_sentences(8, 2)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).logits
    theirs = logits.log_softmax(-1).gather(-1, batch.labels.clamp(min=0)[..., None])[..., 0]
    for row, ours in enumerate(our_logprobs(loaded, sources, targets)):
        marian_ids = [loaded.src_vocab.original_ids[i] for i in loaded.src_vocab.encode(sources[row])]
        assert marian_ids == batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        torch.testing.assert_close(ours, theirs[row, :len(ours)], atol=1e-4, rtol=0)


def test_source_ids_equal_marian_tokenizer_punctuation_included(tmp_path):
    """MarianTokenizer does not normalise punctuation (it never calls its Moses normaliser): the
    ids of text Moses would change equal nmtkit's. A special token written as text is that token
    to MarianTokenizer, text to nmtkit (docs/pretrained.md names both)."""
    from transformers import MarianTokenizer

    hf_dir = make_marian(tmp_path / "hf", **SHAPES["multilingual"])
    vocab = load_model_dir(import_marian(str(hf_dir), tmp_path / "model")).src_vocab
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    for line in ("«the cat» — sat…  on „the“ mat ’s", "the cat , sat .", ">>fra<<the  cat  "):
        assert [vocab.original_ids[i] for i in vocab.encode(line)] == tokenizer(line).input_ids, line
    theirs = tokenizer("the </s> cat").input_ids
    assert theirs == [*tokenizer("the").input_ids, *tokenizer("cat").input_ids]  # </s> read as the token
    assert [vocab.original_ids[i] for i in vocab.encode("the </s> cat")].count(tokenizer.eos_token_id) == 1


def test_an_over_long_source_keeps_its_eos_as_marian_tokenizer_truncates(tmp_path):
    """A source over the limit is cut as MarianTokenizer(truncation=True) cuts it: its pieces,
    then </s> last (a >>xx<< code stays first); a line within the limit stays whole."""
    from transformers import MarianTokenizer

    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator

    hf_dir = make_marian(tmp_path / "hf", **SHAPES["multilingual"])
    loaded = load_model_dir(import_marian(str(hf_dir), tmp_path / "model"))
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    lines = [" ".join(tiny_sentences(4, 5)), "the cat"]
    for lang, code in (("", ""), ("deu", ">>deu<< ")):
        options = TranslateOptions(max_source_len=10, target_lang=lang, device="cpu", dtype="float32")
        translator = Translator(TorchEngine.from_loaded([loaded], options), options)
        ours = [[loaded.src_vocab.original_ids[i] for i in ids] for ids in translator.encode(lines)]
        theirs = tokenizer([code + line for line in lines], truncation=True, max_length=10).input_ids
        assert ours == theirs
        assert len(ours[0]) == 10 and ours[0][-1] == tokenizer.eos_token_id == 0 and len(ours[1]) < 10
        assert translator.truncated == 1  # the warning still counts the cut line


def hf_translations(hf, tokenizer, lines: list[str], beam: int, max_pieces: int,
                    sequences: list | None = None) -> list[str]:
    """transformers' generate with our search's rules: pad never generated, raw log-prob ranking
    (lenpen 0), at most ``max_pieces`` pieces and then EOS. ``sequences``: gets each output's ids."""
    out = []
    pad = hf.config.pad_token_id
    for start in range(0, len(lines), 50):
        batch = tokenizer(lines[start:start + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = hf.generate(**batch, num_beams=beam, do_sample=False, max_new_tokens=max_pieces + 1,
                              length_penalty=0.0, early_stopping=True, bad_words_ids=[[pad]],
                              num_return_sequences=1)
        out += tokenizer.batch_decode(ids, skip_special_tokens=True)
        if sequences is not None:  # the decoder start, then the output up to its EOS (pad after it)
            sequences += [[pad] + [t for t in row[1:].tolist() if t != pad] for row in ids]
    return out


@pytest.mark.parametrize("beam,shape", [(1, "shared-swish-scaled"), (4, "shared-swish-scaled"),
                                        (4, "shared-gelu-untied")])
def test_translations_equal_marian_generate(tmp_path, beam, shape):
    hf_dir = make_marian(tmp_path / "hf", seed=3, **SHAPES[shape])
    model_dir = import_marian(str(hf_dir), tmp_path / "model")
    loaded = load_model_dir(model_dir)
    hf, tokenizer = hf_pair(hf_dir)
    lines = [" ".join(line.split()[:4]) for line in tiny_sentences(200, 7)]
    options = TranslateOptions.from_decode(saved_decode_settings(model_dir), beam_size=beam, lenpen=0.0,
                                           max_len_a=0.0, max_len_b=12, min_len=0, device="cpu", dtype="float32")
    assert options.eos_at_limit == "free"  # the import's default: generate's rule
    ours = translate_lines([loaded], lines, options)
    sequences: list = []
    theirs = hf_translations(hf, tokenizer, lines, beam, 12, sequences)
    same = sum(a == b for a, b in zip(ours, theirs))
    assert same >= 0.99 * len(lines), [(a, b) for a, b in zip(ours, theirs) if a != b][:3]
    assert more_probable_where_different(loaded, hf, tokenizer, lines, ours, theirs, sequences, options) == \
        len(lines) - same


def test_scored_eos_at_the_limit_is_where_beam_differs_from_generate(tmp_path):
    """nmtkit's own rule (the forced EOS's log-probability counts) parts from generate exactly on
    outputs that end at the length limit, and there nmtkit's is the more probable output."""
    hf_dir = make_marian(tmp_path / "hf", seed=3, **SHAPES["shared-gelu-untied"])
    model_dir = import_marian(str(hf_dir), tmp_path / "model")
    loaded = load_model_dir(model_dir)
    hf, tokenizer = hf_pair(hf_dir)
    lines = [" ".join(line.split()[:4]) for line in tiny_sentences(60, 7)]
    options = TranslateOptions.from_decode(saved_decode_settings(model_dir), beam_size=4, lenpen=0.0, max_len_a=0.0,
                                           max_len_b=12, min_len=0, device="cpu", dtype="float32",
                                           eos_at_limit="scored")
    ours = translate_lines([loaded], lines, options)
    sequences: list = []
    theirs = hf_translations(hf, tokenizer, lines, 4, 12, sequences)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert differ  # this model runs into the limit often enough
    assert all(len(sequences[i]) == 12 + 2 for i in differ)  # start, 12 pieces, the forced EOS
    assert more_probable_where_different(loaded, hf, tokenizer, lines, ours, theirs, sequences, options) == len(differ)


def more_probable_where_different(loaded, hf, tokenizer, lines, ours, theirs, sequences, options) -> int:
    """Of the lines where the outputs differ, how many have nmtkit's output at least as probable
    as generate's, both scored by MarianMTModel itself under ``options``' rule for the EOS forced
    at the length limit (``eos_at_limit`` free: it counts 0, as in generate)."""
    scored = dataclasses.replace(options, scores=True)  # "logprob \t text" (lenpen 0: the raw log-probability)
    count = 0
    for line, mine, other, ids in zip(lines, ours, theirs, sequences):
        if mine == other:
            continue
        mine_logprob = float(translate_lines([loaded], [line], scored)[0].split("\t")[0])
        batch = tokenizer([line], return_tensors="pt")
        at_limit = len(ids) - 2 >= options.max_len_b
        ids = torch.tensor([ids])
        with torch.no_grad():
            logits = hf(**batch, decoder_input_ids=ids[:, :-1]).logits
        steps = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[0, :, 0]
        other_logprob = float(steps[:-1].sum() if at_limit and options.eos_at_limit == "free" else steps.sum())
        count += mine_logprob >= other_logprob - 1e-4
    return count
