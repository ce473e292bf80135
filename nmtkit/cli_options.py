"""The options of ``nmtkit translate`` (and the ones ``serve`` shares): declared once here, with
their help texts, so the command's signature stays a list of names. Every default comes from
``TranslateOptions`` (which embeds ``DecodeConfig``): one home for the values."""
from __future__ import annotations

import typer

from nmtkit.decoding.options import TranslateOptions

DEFAULTS = TranslateOptions()  # one home for every translate default: DecodeConfig and TranslateOptions
DEVICE = typer.Option(DEFAULTS.device, "--device", help="auto, cpu, cuda or cuda:N.")
DTYPE = typer.Option(DEFAULTS.dtype, "--dtype", help="auto, float32, bf16, fp16 or int8 (CPU; ctranslate2: its compute type).")


def decode_flag(setting: str, text: str, *short: str):
    """A decode flag, unset unless given: the model's saved setting (else DecodeConfig's) applies then."""
    return typer.Option(None, "--" + setting.replace("_", "-"), *short, show_default=False,
                        help=f"{text}. Default: the model's (from its recipe), else {getattr(DEFAULTS, setting)}.")


MODEL = typer.Option(..., "-m", "--model", help="Model directory (repeat to ensemble).")
INPUT = typer.Option(None, "-i", "--input", help="Source text file (default or -: stdin).")
OUTPUT = typer.Option(None, "-o", "--output", metavar="<path>", show_default=False,
    help="Output file (default or -: stdout), written atomically; a device or "
    "named pipe is written directly, an open descriptor (/dev/stdout, /dev/fd/N) appended to, "
    "a symbolic link is followed.")
BEAM_SIZE = decode_flag("beam_size", "Beam size (1: greedy)", "-b")
LENPEN = decode_flag("lenpen", "GNMT length penalty alpha; 0 ranks by raw log-probability, larger favours longer outputs")
MAX_LEN_A = decode_flag("max_len_a", "Output length limit a*|x|+b: a")
MAX_LEN_B = decode_flag("max_len_b", "Output length limit a*|x|+b: b")
MIN_LEN = decode_flag("min_len", "Minimum output length in pieces (EOS blocked before)")
NBEST = typer.Option(DEFAULTS.nbest, "--nbest", min=1, help="N > 1: exactly N lines per input line, best first, as "
    "INDEX<tab>SCORE<tab>TEXT (INDEX: the input line, from 0; --alignments adds a 4th "
    "field). Lines the search cannot fill (all but the first for an empty input) have an "
    "empty text and score -inf.")
BATCH_TOKENS = decode_flag("batch_tokens", "Source tokens x beam per batch")
SCORES = typer.Option(DEFAULTS.scores, "--scores", help="Prefix each line with its score and a tab (with --nbest above 1 always).")
ALIGNMENTS = typer.Option(DEFAULTS.alignments, "--alignments", help="Append a tab and Pharaoh alignment pairs "
    "i-j (as fast_align and Moses write them): source word i is aligned to target word j, "
    "words split at whitespace and counted from 0, pairs sorted. Each target piece is "
    "aligned to the source piece it attends to most.")
ALIGNMENT_UNITS = typer.Option(DEFAULTS.alignment_units, "--alignment-units", help="What --alignments counts: "
    "words, or pieces (SentencePiece pieces; one pair per target piece, in order).")
SAMPLE = typer.Option(DEFAULTS.sample, "--sample", help="Sample instead of beam search (for back-translation).")
TOPK = typer.Option(DEFAULTS.topk, "--topk", help="Sampling: keep the k most likely pieces (0: all).")
TOPP = typer.Option(DEFAULTS.topp, "--topp", help="Sampling: nucleus probability mass.")
TEMPERATURE = typer.Option(DEFAULTS.temperature, "--temperature", help="Sampling temperature.")
SEED = typer.Option(DEFAULTS.seed, "--seed", help="Random seed for sampling.")
ERRORS = typer.Option(DEFAULTS.errors, "--errors", help="Invalid UTF-8 input: strict (error) or replace.")
ENGINE = typer.Option(DEFAULTS.engine, "--engine", help="auto (ctranslate2 for a directory written by nmtkit "
    "export, torch otherwise), torch or ctranslate2.")
COMPILE = typer.Option(DEFAULTS.compile, "--compile", help="torch.compile the decoder step (needs a C++ compiler on CPU; the first batches pay the compile time).")
PREFIX_FILE = typer.Option(None, "--prefix-file", show_default=False,
    help="Target prefixes, one line per input line (a blank line: none): "
    "each output starts with exactly its prefix and goes on from it.")
CONSTRAINTS = typer.Option(None, "--constraints", show_default=False,
    help='Terminology constraints, one JSON list of target phrases per input '
    'line (e.g. ["Haus", "rote Katze"]; [] or a blank line: none): '
    "each phrase appears in the output when the length limit leaves "
    "room (beam search, torch engine).")
TARGET_LANG = typer.Option(DEFAULTS.target_lang, "--target-lang", metavar="<lang>", show_default=False,
    help="A multilingual model: the language to translate into (puts its tag, e.g. "
    "<2es>, before every line).")
STREAM = typer.Option(DEFAULTS.stream, "--stream", help="Translate each input line as it arrives and flush "
    "its output at once (always when stdin is a terminal); without it, lines are read "
    "and translated --chunk-lines at a time.")
MAX_SOURCE_LEN = typer.Option(DEFAULTS.max_source_len, "--max-source-len", help="Source pieces read per line; "
    "longer lines are cut with a warning (0: the model's max_positions; a model with a sinusoidal or learned "
    "position table cannot go past it, rope, alibi and rnn can).")
CHUNK_LINES = typer.Option(DEFAULTS.chunk_lines, "--chunk-lines", help="Lines read, translated and written at "
    "a time; with -i FILE -o FILE each finished chunk is saved beside the output, so "
    "the same command after a crash continues from the last one.")
