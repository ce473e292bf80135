"""Tiny random MarianMT models built with transformers, written as Hugging Face directories
(config.json, model.safetensors, source.spm, target.spm, vocab.json[, target_vocab.json]) as
OPUS-MT publishes them: the tests' stand-in for a downloaded model (no network)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import tiny_sentences


SPM_CONTROL = {"<unk>", "<s>", "</s>", "<pad>"}


def _spm(directory: Path, name: str, seed: int) -> Path:
    """A SentencePiece model numbered its own way (unk 0, <s> 1, </s> 2: ids Marian never uses)."""
    import sentencepiece as spm

    path = directory / name
    corpus = directory / f"{name}.txt"
    corpus.write_text("\n".join(tiny_sentences(400, seed)) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.Train(input=str(corpus), model_prefix=str(directory / f"{name}.tmp"), vocab_size=32,
                                   minloglevel=2, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    Path(f"{directory / name}.tmp.model").rename(path)
    return path


def _pieces(spm_path: Path) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    return [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if sp.IdToPiece(i) not in SPM_CONTROL]


def _vocab(pieces: list[str], codes: tuple[str, ...]) -> dict:
    """Marian's vocab.json layout: </s> 0, <unk> 1, the pieces, <pad> last."""
    ordered = ["</s>", "<unk>", *codes, *dict.fromkeys(pieces)]
    return {piece: i for i, piece in enumerate(ordered + ["<pad>"])}


def make_marian(out: Path, shared: bool = True, activation: str = "swish", scale: bool = True,
                codes: tuple[str, ...] = (), tied: bool = True, seed: int = 0, d_model: int = 16,
                layers: int = 2, generation: dict | None = None) -> Path:
    """Write a random MarianMT model directory ``out``; ``codes``: >>xx<< target-language tokens."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    out.mkdir(parents=True)
    scratch = out.parent / f"{out.name}.spm"
    scratch.mkdir()
    src_spm, tgt_spm = _spm(scratch, "source.spm", seed), _spm(scratch, "target.spm", seed + 1)
    if shared:
        src_vocab = tgt_vocab = _vocab(_pieces(src_spm) + _pieces(tgt_spm), codes)
    else:
        src_vocab, tgt_vocab = _vocab(_pieces(src_spm), codes), _vocab(_pieces(tgt_spm), ())
    pad = tgt_vocab["<pad>"]
    config = MarianConfig(vocab_size=len(src_vocab), decoder_vocab_size=len(tgt_vocab), d_model=d_model,
                          encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
                          max_position_embeddings=128, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
                          forced_eos_token_id=0, activation_function=activation, scale_embedding=scale,
                          share_encoder_decoder_embeddings=shared, tie_word_embeddings=tied, init_std=0.3)
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # every tensor random, so that each one's place is tested
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
        model.final_logits_bias.normal_(0, 1.0)
        # a trained model never predicts <pad> (its probability is ~0): transformers' generate bans it and
        # renormalises, nmtkit's search bans it without renormalising; the two agree only where it is ~0
        model.final_logits_bias[0, pad] = -100.0
    model.save_pretrained(out)
    shutil.copyfile(src_spm, out / "source.spm")
    shutil.copyfile(tgt_spm, out / "target.spm")
    (out / "vocab.json").write_text(json.dumps(src_vocab), encoding="utf-8")
    if not shared:
        (out / "target_vocab.json").write_text(json.dumps(tgt_vocab), encoding="utf-8")
    tokenizer = {"separate_vocabs": not shared, "source_lang": "src", "target_lang": "tgt",
                 "tokenizer_class": "MarianTokenizer"}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    if generation is not None:
        (out / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    shutil.rmtree(scratch)
    return out
