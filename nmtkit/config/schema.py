"""What a recipe may say: one dataclass per section, every key with its default and a comment,
so a recipe names only what differs. Loading and checking: ``loading.py`` and ``rules.py``."""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional


@dataclass
class CleanConfig:
    """Training-data filters; dev and test are never filtered."""

    max_len: int = 250  # drop pairs with more SentencePiece tokens than this on either side
    max_ratio: float = 3.0  # drop pairs whose token-length ratio exceeds this (0 disables)
    dedup: bool = True  # drop exact duplicate pairs


@dataclass
class SourceConfig:
    """One source of parallel data with its own keys: ``data`` itself, or one of ``data.corpora``."""

    # files | hf | sword: required, so a forgotten line cannot quietly train on another corpus;
    # each source's own keys below (files / hf_* / sword_*) are an error under another source
    source: str = ""
    src_lang: str = "en"
    tgt_lang: str = "es"
    # files: {split: {lang: path}} e.g. {"train": {"en": "a.en", "es": "a.es"}, ...}
    files: dict = field(default_factory=dict)
    # hf: a `datasets` dataset with a `translation` column
    hf_name: str = ""  # e.g. "wmt/wmt14" or a local directory (save_to_disk / parquet)
    hf_config: str = ""  # e.g. "de-en"
    hf_revision: str = ""  # pin the Hub revision for reproducibility
    hf_splits: dict = field(default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})
    max_train_pairs: int = 0  # keep only the first N training pairs (0: all)
    # sword: verse-aligned Bible modules installed under sword_path
    sword_src: str = "engWEB2015eb"
    sword_tgt: str = "spaRV1909eb"
    sword_path: str = "/usr/share/sword"
    # old: the books before Matthew; new: Matthew to Revelation (domain experiments); all: both
    sword_testament: Literal["all", "old", "new"] = "all"
    dev_size: int = 500  # verses held out for dev and test (the other sources bring their own splits)
    test_size: int = 1000

    def training_only(self, first: bool) -> bool:
        """A files corpus after the first that names no dev or test files gives training pairs
        only (a back-translated or distilled corpus has none of its own)."""
        return (not first and self.source == "files" and isinstance(self.files, dict)
                and not {"dev", "test"} & set(self.files))


@dataclass
class CorpusConfig(SourceConfig):
    """One training corpus of ``data.corpora``: a source (its keys as in ``data``), a weight and a tag."""

    src_lang: str = ""  # the languages of its source's files / hf columns (default: data's)
    tgt_lang: str = ""
    name: str = ""  # required: names the corpus in prepare's report and the manifest
    weight: float = 1.0  # pairs per epoch = round(weight x its cleaned pairs) (nmtkit/data/mixing.py)
    tag: str = ""  # prepended to each of its source sentences (e.g. <2es>, <bt>); reserved as one piece


@dataclass
class DataConfig(SourceConfig):
    # several training corpora instead of the one source above (whose keys then stay unset but
    # src_lang / tgt_lang, which name the prepared files); dev and test come from the first corpus
    corpora: list[CorpusConfig] = field(default_factory=list)
    clean: CleanConfig = field(default_factory=CleanConfig)
    # which split of the corpus into train / dev / test: 0 = the source's own (files and hf: their
    # dev and test; sword: evenly spread verses); N > 0 re-draws dev and test at random with seed N
    # at the same sizes, the rest for training (nmtkit/data/sources/resplit.py). Every corpus of
    # data.corpora that has dev and test is re-drawn with it.
    split_seed: int = 0

    def training_sources(self) -> list[CorpusConfig]:
        """The corpora with their languages filled in, or ``data`` itself as one untagged corpus."""
        if not self.corpora:
            own = {f.name: getattr(self, f.name) for f in dataclasses.fields(SourceConfig)}
            return [CorpusConfig(**own, name=self.source)]
        return [dataclasses.replace(c, src_lang=c.src_lang or self.src_lang, tgt_lang=c.tgt_lang or self.tgt_lang)
                for c in self.corpora]

    def reference_language(self, split: str = "test") -> str:
        """The language of ``split``'s references, which chooses BLEU's tokenizer: dev and test come
        from the first corpus (its target language), test.NAME from corpus NAME."""
        sources = self.training_sources()
        named = [c for c in sources if split.startswith("test.") and c.name == split[len("test."):]]
        return (named or sources)[0].tgt_lang

    def reference_languages(self) -> list[str]:
        """The target languages of the corpora with dev and test sets, each once (what any test
        set may be scored in)."""
        sources = self.training_sources()
        return list(dict.fromkeys(c.tgt_lang for i, c in enumerate(sources) if not c.training_only(i == 0)))

    @property
    def tags(self) -> list[str]:
        """The corpora's tags, each once, in order (reserved as pieces of the SentencePiece model)."""
        return list(dict.fromkeys(c.tag for c in self.corpora if c.tag))


@dataclass
class VocabConfig:
    type: Literal["unigram", "bpe"] = "unigram"
    size: int = 8000
    joint: bool = True  # one shared model for both languages (enables full weight tying)
    character_coverage: float = 1.0
    # SentencePiece trains on a seeded uniform sample of this many lines of the whole corpus (0: all),
    # and of no more lines than hold `input_bytes` bytes at the corpus's mean line length (0: no cap):
    # its memory grows with the sample's text, ~20 bytes a byte for unigram (README, Speed)
    input_sentence_size: int = 2_000_000
    input_bytes: int = 150_000_000
    workers: int = 0  # encoding processes (0: one per CPU core)
    # a character the training text never showed becomes its UTF-8 bytes (256 pieces of vocab.size)
    # instead of <unk>, so it is translated or copied, never output as "⁇"; auto: on when vocab.size is
    # at least BYTE_FALLBACK_MIN_SIZE (below, the bytes would crowd out the pieces); recipes written
    # before this key existed meant false (LEGACY_VALUES)
    byte_fallback: Literal["auto", True, False] = "auto"
    # SentencePiece's text normalisation: nmt_nfkc (NFKC + whitespace rules, its default), nfkc,
    # nmt_nfkc_cf (also case-folded: a lowercased model) or identity (the text as it is)
    normalization: Literal["nmt_nfkc", "nfkc", "nmt_nfkc_cf", "identity"] = "nmt_nfkc"
    split_digits: bool = False  # every digit its own piece (numbers copied digit by digit)
    # reuse the SentencePiece model(s) of a model directory or a prepared directory instead of
    # training new ones (fine-tuning); type, size and joint must describe them (recipe key: vocab.from)
    from_: str = ""


    def uses_byte_fallback(self) -> bool:
        """Whether SentencePiece is trained with byte pieces (byte_fallback resolved)."""
        if self.byte_fallback == "auto":
            return self.size >= BYTE_FALLBACK_MIN_SIZE
        return bool(self.byte_fallback)


BYTE_FALLBACK_MIN_SIZE = 1024  # the 256 byte pieces then take at most a quarter of the vocabulary


@dataclass
class ModelConfig:
    arch: Literal["transformer", "rnn"] = "transformer"
    preset: str = ""  # "transformer-base" / "transformer-big" fill the dims below
    d_model: int = 512
    ffn_dim: int = 2048
    heads: int = 8
    key_dim: int = 0  # per-head size of queries and keys (the paper's d_k, Table 3 row B); 0 = d_model / heads
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    pre_norm: bool = False  # the paper is post-norm
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    ffn: Literal["relu", "gelu", "silu", "swiglu"] = "relu"  # silu: Marian's "swish"
    embed_scale: bool = True  # token embeddings times sqrt(d_model), as the paper (MarianMT: scale_embedding)
    # sinusoidal positions: interleaved (the paper: sin on even, cos on odd dims) | halves (all sines,
    # then all cosines: Marian, tensor2tensor)
    sinusoid_layout: Literal["interleaved", "halves"] = "interleaved"
    output_bias: bool = False  # a bias on the output layer (MarianMT's final_logits_bias)
    # sinusoidal (the paper) | learned (a table of max_positions rows) | alibi | rope (no table: any training
    # length; translation reads max_positions source pieces unless `translate --max-source-len` says more)
    positions: Literal["sinusoidal", "learned", "alibi", "rope"] = "sinusoidal"
    # Mixture of Experts feed-forward layers (nmtkit/models/moe.py); 0 experts = dense layers
    moe_experts: int = 0  # experts per MoE layer
    moe_top_k: int = 2  # experts per token: 1 = Switch Transformer, 2 = GShard
    moe_every: int = 1  # every n-th layer of each stack is MoE (1: all; GShard: 2)
    moe_aux_weight: float = 0.01  # weight of the load-balancing loss (1 at uniform routing), per MoE layer
    moe_z_weight: float = 0.0  # weight of the router z-loss (ST-MoE: 0.001); 0 disables
    moe_capacity_factor: float = 0.0  # training only: expert capacity = factor * tokens * k / experts (0: dropless)
    tie_embeddings: Literal["all", "decoder", "none"] = "all"  # "all" needs a joint vocab
    max_positions: int = 1024
    # rnn only
    cell: Literal["lstm", "gru", "rnn"] = "lstm"
    embed_dim: int = 256
    hidden_dim: int = 512
    bidirectional: bool = True
    merge: Literal["concat", "sum"] = "concat"  # how the two encoder directions combine
    attention: Literal["bahdanau", "luong-dot", "luong-general", "none"] = "bahdanau"
    input_feed: bool = True

    @property
    def width(self) -> int:
        """The model dimension (the noam schedule scales its rate by width ** -0.5)."""
        return self.d_model if self.arch == "transformer" else self.hidden_dim

    @property
    def key_size(self) -> int:
        """The per-head size of queries and keys: ``key_dim``, or d_model / heads when 0."""
        return self.key_dim or self.d_model // self.heads


# the model keys only one architecture reads; every other key is shared (tests/test_config_arch.py)
ARCH_KEYS: dict[str, tuple[str, ...]] = {
    "transformer": ("preset", "d_model", "ffn_dim", "heads", "key_dim", "attention_dropout", "activation_dropout", "pre_norm",
                    "norm", "ffn", "embed_scale", "sinusoid_layout", "output_bias", "max_positions", "positions", "moe_experts", "moe_top_k", "moe_every",
                    "moe_aux_weight", "moe_z_weight", "moe_capacity_factor"),
    "rnn": ("cell", "embed_dim", "hidden_dim", "bidirectional", "merge", "attention", "input_feed"),
}


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # tokens (max of src, tgt) per batch, padding included
    update_freq: int = 1  # batches accumulated per optimizer step, per process (x GPUs under torchrun)
    # batches per optimizer step over ALL processes (0: off, use update_freq); each of N processes
    # takes batches_per_update / N of them (must divide), so the update is the same on 1, 8 or 64 GPUs
    batches_per_update: int = 0
    max_steps: int = 100_000
    max_epochs: int = 0  # 0: no epoch limit
    max_minutes: float = 0.0  # wall-clock budget (0: none); stops at the next step boundary
    # training FLOPs budget (0: none), counted from the model's shapes per real token, forward + backward
    # = 3 x forward (nmtkit/models/flops.py, docs/training.md, "Compute budgets"); stops at the first update that reaches it
    max_flops: float = 0.0
    # noam (the paper) | inverse_sqrt | constant | cosine / linear (warm-up, then decay to 0 at max_steps)
    schedule: Literal["noam", "inverse_sqrt", "constant", "cosine", "linear"] = "noam"
    lr: float = 1.0  # noam: multiplier of d_model^-0.5 ...; inverse_sqrt/constant: peak lr
    warmup: int = 4000
    betas: tuple = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0  # above 0: AdamW, decay decoupled from the gradient
    label_smoothing: float = 0.1
    # subword regularisation: training sentences re-segmented every epoch by SentencePiece sampling,
    # seeded by (seed, epoch, sentence); dev and test keep their one segmentation. 0 turns it off.
    subword_alpha: float = 0.0  # unigram: sharpness of the sampling distribution (Kudo 2018: 0.1-0.5); bpe: dropout (0.1)
    subword_nbest: int = -1  # unigram: sample among the n best segmentations (-1: all of them)
    clip_norm: float = 0.0  # 0 disables
    ema_decay: float = 0.0  # 0 disables the exponential moving average of weights
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: Literal["auto", "float32", "bf16", "fp16"] = "auto"
    # torch.compile the model for training (TorchInductor; on CPU it needs a C++ compiler, else a
    # warning and uncompiled training); the first steps pay the compile time (benchmarks/compile_speed.py)
    compile: bool = False
    threads: int = 0  # CPU threads (0: auto, fewer when other processes keep cores busy at start)
    log_every: int = 50
    validate_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5
    patience: int = 0  # validations without improvement before stopping (0: never)
    best_metric: Literal["bleu", "loss"] = "bleu"
    dev_bleu_beam: int = 1  # beam used for dev BLEU during training (1: greedy)
    dev_bleu_max_sentences: int = 500
    max_bad_steps: int = 5  # consecutive NaN/inf steps before giving up
    average_last: int = 5  # checkpoints averaged by `nmtkit run` (0/1: none)
    tensorboard: bool = False  # also write metrics as TensorBoard scalars to RUN_DIR/tensorboard (needs tensorboard)
    # fine-tuning: start from this model directory's weights (same architecture and vocabulary) with a
    # fresh optimizer, schedule and step counter; a resumed run continues from its own checkpoints
    init_from: str = ""


@dataclass
class DecodeConfig:
    beam_size: int = 4
    lenpen: float = 0.6  # GNMT alpha: score / ((5+|y|)/6)^alpha; 0 = raw log-prob
    max_len_a: float = 1.0
    max_len_b: int = 50  # output length limit = a * |x| + b
    min_len: int = 1
    batch_tokens: int = 6000
    # the EOS forced at the length limit: scored by its log-probability, or free (log 1 = 0: transformers'
    # generate, whose rule imported MarianMT models default to)
    eos_at_limit: Literal["scored", "free"] = "scored"


DECODE_SETTINGS = tuple(f.name for f in dataclasses.fields(DecodeConfig))

# what `nmtkit score --metrics` and eval.metrics may name (comet: an optional extra)
SCORE_METRICS = ("bleu", "chrf", "chrf++", "ter", "comet")
# sacreBLEU's BLEU tokenizers (its -tok); flores101/flores200/spBLEU-1K are spBLEU's SentencePiece models
SCORE_TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "flores101", "flores200", "spBLEU-1K",
                    "none")
# a target language (ISO 639-1 or -3, any region or script subtag) -> the tokenizer BLEU needs for it:
# sacreBLEU's own for Chinese, Japanese and Korean; every character a token for the other scripts
# written without spaces between words (Thai, Lao, Khmer, Burmese, Tibetan, Dzongkha); 13a for the rest
_LANGUAGE_TOKENIZERS = {"zh": "zh", "zho": "zh", "chi": "zh", "cmn": "zh", "yue": "zh", "lzh": "zh", "wuu": "zh",
                        "ja": "ja-mecab", "jpn": "ja-mecab", "ko": "ko-mecab", "kor": "ko-mecab",
                        **dict.fromkeys(("th", "tha", "lo", "lao", "km", "khm", "my", "mya", "bur", "bo", "bod",
                                         "tib", "dz", "dzo"), "char")}


def default_tokenizer(lang: str) -> str:
    """BLEU's tokenizer for text in ``lang`` (zh-Hant, ja_JP, jpn and " th " all count): zh, ja-mecab,
    ko-mecab, char or 13a."""
    primary = lang.strip().replace("_", "-").split("-")[0].lower()
    return _LANGUAGE_TOKENIZERS.get(primary, "13a")


@dataclass
class EvalConfig:
    """How `nmtkit run`, dev BLEU in training and sweeps score: `nmtkit score`'s flags, so that
    dev and test are scored alike (docs/languages.md)."""

    # BLEU's tokenizer (sacreBLEU's -tok); "": chosen from each test set's target language (zh, ja-mecab,
    # ko-mecab, char for Thai, Lao, Khmer, Burmese, Tibetan and Dzongkha, else 13a: docs/languages.md)
    tokenize: Literal[("",) + SCORE_TOKENIZERS] = ""
    metrics: str = "bleu,chrf,ter"  # comma-separated: bleu, chrf, chrf++, ter, comet (BLEU is always computed)
    lowercase: bool = False  # case-insensitive BLEU and chrF
    comet_model: str = ""  # a local COMET model directory (checkpoints/model.ckpt), needed by comet
    comet_batch_size: int = 16  # sentences per COMET forward pass

    def tokenizer(self, tgt_lang: str) -> str:
        """The tokenizer BLEU uses for references in ``tgt_lang``."""
        return self.tokenize or default_tokenizer(tgt_lang)

    def metric_names(self) -> list[str]:
        """eval.metrics as a list, BLEU first whether named or not (tables and model choice need it)."""
        names = [name.strip() for name in self.metrics.split(",") if name.strip()]
        return list(dict.fromkeys(["bleu", *names]))


@dataclass
class Config:
    name: str = "experiment"
    workdir: str = ""  # default: data/<name>
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def work_path(self) -> Path:
        return Path(self.workdir or f"data/{self.name}")

    def to_dict(self) -> dict:
        """The config as a plain tree under its recipe keys (``vocab.from``, not ``from_``)."""
        return _recipe_keys(dataclasses.asdict(self))

    @classmethod
    def legacy_tree(cls) -> dict:
        """The default config's tree with each key of LEGACY_VALUES at its old value: what a
        setting recorded without that key means (saved run configs, manifests, sweep digests)."""
        tree = cls().to_dict()
        for section, values in LEGACY_VALUES.items():
            tree[section].update(values)
        return tree


# Keys whose default differs from what nmtkit did before they existed: a recipe, run config,
# manifest or sweep written before then lacks the key and meant this value. Old work therefore
# keeps its meaning (and its prepared data), while a new recipe gets the new default.
LEGACY_VALUES: dict[str, dict[str, Any]] = {"vocab": {"byte_fallback": False}}
# the vocab keys that shape a trained SentencePiece model (a reused one, vocab.from, has its own)
SPM_TRAINING_KEYS = ("byte_fallback", "normalization", "split_digits")


def recipe_key(field_name: str) -> str:
    """The recipe key of a config field: a Python keyword is spelt with a trailing underscore
    in the dataclass (``VocabConfig.from_`` is ``vocab.from``)."""
    return field_name[:-1] if field_name.endswith("_") else field_name


def _recipe_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {recipe_key(key): _recipe_keys(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_recipe_keys(value) for value in tree]
    return tree


PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3
    "transformer-base": dict(d_model=512, ffn_dim=2048, heads=8, encoder_layers=6, decoder_layers=6, dropout=0.1),
    "transformer-big": dict(d_model=1024, ffn_dim=4096, heads=16, encoder_layers=6, decoder_layers=6, dropout=0.3),
}


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """The resolved field types of a config dataclass (resolving them is slow; they never change)."""
    return typing.get_type_hints(cls)


def section_type(annotation: Any) -> Optional[type]:
    """The dataclass of a ``list[Section]`` field (data.corpora), else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None

