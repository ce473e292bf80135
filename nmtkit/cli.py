"""The ``nmtkit`` command line. Each command parses its options, loads the recipe and
calls one core function. Heavy imports (torch, datasets) happen inside the commands so
that ``nmtkit --help`` stays fast. User errors become one line on stderr:
exit 1 for runtime failures, 2 for bad usage or bad input (``--debug`` shows tracebacks).
"""
from __future__ import annotations

import gc
import os
import re
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from nmtkit import __version__
from nmtkit import cli_options as opts
from nmtkit.serving.requests import Limits


def _readable_types(params: list) -> list:
    """Help without Python types: a flag takes no value, so it shows none (Typer's rich help
    prints ``<bool>``), and a repeatable value shows its element (``<path>...``, not ``<list[Path]>``)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif getattr(getattr(param, "type_descriptor", None), "is_list", False) and param.metavar is None:
            element = re.sub(r"^<list\[(\w+)\]>$", lambda m: f"<{m.group(1).lower()}>...", param.display_type(None))
            param.display_type = lambda ctx, label=element: label
    return params


class _Command(TyperCommand):
    """Every command: help without Python types, and an option of one value given twice refused
    (click keeps the last and drops the others, silently)."""

    def get_params(self, ctx):
        return _readable_types(super().get_params(ctx))

    def parse_args(self, ctx, args):
        given = list(args)  # the parser consumes the list it is given
        rest = super().parse_args(ctx, args)
        if not ctx.resilient_parsing:  # not while the shell completes a word
            order = _parse_order(self, ctx, given)
            if order is not None:
                _refuse_repeats(order)
        return rest


_OPTION_FIELDS = ("opts", "multiple", "is_flag")


def _parse_order(command, ctx, args: list[str]) -> Optional[list]:
    """The parameters in the order click's parser meets them in ``args``, once per use, or None.

    Click says which options were given but not how often, so ``args`` (which parsed already) is
    parsed again by the parser click itself uses: in click 8, ``make_parser(ctx).parse_args(args)``
    returns (values, leftover arguments, that order). This is click's internal API and typer
    pulls in any click, so a parser that does not give the order this way (a later click) gives
    None: repeats then go unchecked, where relying on it would break every command."""
    try:
        parsed = command.make_parser(ctx).parse_args(args=args)
        order = list(parsed[2]) if isinstance(parsed, tuple) and len(parsed) == 3 else None
    except Exception:  # noqa: BLE001 - whatever another click's parser does here; the first parse passed
        return None
    if order is None or not all(_known(param) for param in order):
        return None
    return order


def _known(param) -> bool:
    """A parameter as ``_refuse_repeats`` reads it: an option with opts, multiple and is_flag."""
    kind = getattr(param, "param_type_name", None)
    return isinstance(kind, str) and (kind != "option" or all(hasattr(param, name) for name in _OPTION_FIELDS))


def _refuse_repeats(order: list) -> None:
    """An option that takes one value, given twice, is an error: the parser would keep the last
    and drop the others silently (``-i a.txt -i b.txt`` translating only b.txt). ``order``: the
    parameters in the order the parser met them; those declared repeatable (``-m``) may repeat."""
    from collections import Counter

    from nmtkit.errors import ConfigError

    for param, count in Counter(order).items():
        if count > 1 and param.param_type_name == "option" and not param.multiple:
            times = "twice" if count == 2 else f"{count} times"
            what = "is a flag" if param.is_flag else "takes one value, and only the last would count"
            raise ConfigError(f"{'/'.join(param.opts)} given {times}: it {what}; give it once")


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _readable_types(super().get_params(ctx))


app = typer.Typer(
    cls=_Group,
    name="nmtkit",
    help="Neural machine translation: prepare data, train Transformers and RNNs, translate, serve, score.",
    epilog="Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input, 130 interrupted, 143 terminated. "
           "Colours are off when output is not a terminal or NO_COLOR is set.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False, "verbosity": 0}

RecipeArg = typer.Argument(..., help="YAML recipe (see recipes/).", show_default=False)
OverridesArg = typer.Argument(None, help="Dotted overrides, e.g. train.max_steps=1000 model.dropout=0.2.",
                              show_default=False)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmtkit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only warnings and errors."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="More detail."),
) -> None:
    _state["debug"] = debug or bool(os.environ.get("NMTKIT_DEBUG"))
    _state["verbosity"] = -1 if quiet else (1 if verbose else 0)
    from nmtkit.runtime.allocator import bound_kernel_caches, keep_freed_memory

    keep_freed_memory()  # before the first large tensor: see runtime/allocator.py
    bound_kernel_caches()  # before torch loads oneDNN (no command has imported it yet)


def _unused(ctx: typer.Context, rules: list) -> list[str]:
    """``FLAG why`` for each option given on the command line where it has no effect. ``rules``:
    (parameter, whether it is unused now, why)."""
    found = []
    for name, unused, why in rules:
        source = ctx.get_parameter_source(name)  # an enum of click's (or of the click Typer bundles)
        if unused and source is not None and source.name != "DEFAULT":
            flag = next(max(param.opts, key=len) for param in ctx.command.params if param.name == name)
            found.append(f"{flag} {why}")
    return found


def _refuse_unused(ctx: typer.Context, rules: list) -> None:
    """An option given on the command line where it has no effect is an error: accepted and
    silently ignored, it would let a user believe it did something."""
    from nmtkit.errors import ConfigError

    unused = _unused(ctx, rules)
    if unused:
        raise ConfigError(unused[0])


def _console():
    from nmtkit.runtime.console import get_console

    return get_console(_state["verbosity"])


def _load(recipe: Path, overrides: Optional[List[str]]):
    from nmtkit.config import load_config

    return load_config(recipe, overrides or [])


@app.command(cls=_Command)
def prepare(recipe: Path = RecipeArg, overrides: Optional[List[str]] = OverridesArg) -> None:
    """Get parallel data, clean it, train SentencePiece and encode every split."""
    cfg = _load(recipe, overrides)
    from nmtkit.data.prepare import prepare as run_prepare

    run_prepare(cfg, _console())


@app.command(cls=_Command)
def train(
    recipe: Path = RecipeArg,
    overrides: Optional[List[str]] = OverridesArg,
    restart: bool = typer.Option(False, "--restart", help="Start from scratch: the existing run is moved aside (train.old-DATE), not deleted."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Build the model, print its size and the batch; no training."),
) -> None:
    """Train a model; resumes from the last checkpoint of the run unless --restart."""
    cfg = _load(recipe, overrides)
    from nmtkit.training.trainer import train as run_train

    run_train(cfg, _console(), restart=restart, dry_run=dry_run)


@app.command(cls=_Command)
@opts.option_groups
def translate(ctx: typer.Context, model: opts.Models, run_flags: opts.RunFlags, files: opts.FileFlags,
              decode_flags: opts.DecodeFlags, call: opts.CallFlags) -> None:
    """Translate a file or stdin; always one output line per input line, in order. Decode
    settings not given as flags are the model's own (its recipe's decode section)."""
    from nmtkit.runtime.threads import start_reading

    start_reading(run_flags.threads)  # auto threads: the load is read while torch and the model load
    from nmtkit.decoding.guides import GuideFiles
    from nmtkit.translate_files import reads_a_terminal, resolve_options, translate_file

    terminal = not call.stream and reads_a_terminal(files.input)  # translated line by line, as --stream does
    _refuse_unused(ctx, [("topk", not call.sample, "applies to --sample only"),
                         ("topp", not call.sample, "applies to --sample only"),
                         ("temperature", not call.sample, "applies to --sample only"),
                         ("seed", not call.sample, "applies to --sample only (beam search is deterministic)"),
                         ("beam_size", call.sample, "does not apply with --sample, which draws --nbest samples"),
                         ("chunk_lines", call.stream, "does not apply with --stream, which translates each line alone"),
                         ("alignment_units", not call.alignments, "applies to --alignments only"),
                         ("workers", call.sample and call.workers > 1, "applies to beam and greedy search: "
                          "--sample searches one batch at a time (one random stream, drawn in order)"),
                         ("workers", call.compile and call.workers > 1, "does not apply with --compile, which "
                          "searches one batch at a time"),
                         ("workers", call.stream and call.workers > 1, "does not apply with --stream, which "
                          "translates each line alone"),
                         ("chunk_lines", terminal, "does not apply to a terminal, whose lines are translated one "
                          "by one as they are typed"),
                         ("workers", terminal and call.workers > 1, "does not apply to a terminal, whose lines are "
                          "translated one by one as they are typed")])
    options = resolve_options(model, vars(decode_flags), **opts.settings(run_flags, call))
    # greedy search and sampling choose the same pieces under any length penalty and EOS rule: those
    # change only the scores, which only --scores and --nbest show. A warning, not a refusal: a loop
    # over beam sizes (-b 1, 4, 8) with one --lenpen still runs its greedy step (the model's own
    # settings are not flags, so only a flag given on the command line is named)
    one_way = (options.beam_size == 1 or options.sample) and not options.scores and options.nbest == 1
    why = "changes only the scores under --sample, which only --scores prints and --nbest ranks by: the " \
          "translations are those without it" if options.sample else "changes only the scores under greedy " \
          "search (beam size 1), which only --scores prints: the translations are those without it"
    console = _console()
    for line in _unused(ctx, [(name, one_way, why) for name in ("lenpen", "eos_at_limit")]):
        console.warn(line)
    translate_file([str(m) for m in model], files.input, files.output, options, console,
                   GuideFiles(files.prefix_file, files.constraints))


_LIMITS = Limits()  # the server's request limits, defined once


@app.command(cls=_Command)
@opts.option_groups
def serve(
    model: opts.Models,
    run_flags: opts.RunFlags,
    decode_flags: opts.DecodeFlags,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", help="TCP port (0: any free port, printed at start)."),
    batch_window_ms: float = typer.Option(5.0, "--batch-window-ms", help="How long the first waiting request waits for others to join its batch."),
    max_body_bytes: int = typer.Option(_LIMITS.max_body_bytes, "--max-body-bytes", help="Largest request body (413 above)."),
    max_lines: int = typer.Option(_LIMITS.max_lines, "--max-lines", help="Most texts per request (413 above)."),
    max_line_chars: int = typer.Option(_LIMITS.max_line_chars, "--max-line-chars", help="Longest text in characters (413 above)."),
    max_beam: int = typer.Option(_LIMITS.max_beam, "--max-beam", help="Largest beam_size and nbest a request may ask for (at most 64)."),
    max_search_bytes: int = typer.Option(_LIMITS.max_search_bytes, "--max-search-bytes",
                                         help="Largest estimated memory of one search call a request may need (413 above)."),
    read_timeout: float = typer.Option(_LIMITS.read_timeout_s, "--read-timeout",
                                       help="Seconds a request's head may take to arrive (from the connection or the "
                                            "previous answer), and its body after the head (408 after)."),
    request_timeout: float = typer.Option(_LIMITS.request_timeout_s, "--request-timeout",
                                          help="Seconds a request may wait and translate once its body arrived (503 "
                                               "if it never reached the model, else 504; its search stops)."),
    max_queued: int = typer.Option(_LIMITS.max_queued, "--max-queued",
                                   help="Most requests waiting for the model (503 with Retry-After above)."),
    max_connections: int = typer.Option(_LIMITS.max_connections, "--max-connections",
                                        help="Most open connections (503 with Retry-After above, as they connect)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="NMTKIT_API_KEY", show_default=False,
                                          help="Answer only requests that carry this key ('Authorization: Bearer KEY' "
                                               "or 'X-API-Key: KEY'); others get 401."),
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health, /info, /metrics (needs the serve extra).
    A request's decode settings default to these flags, else to the model's saved ones, as in translate."""
    from nmtkit.runtime.threads import start_reading

    start_reading(run_flags.threads)  # auto threads: the load is read while the HTTP stack and the model load
    from nmtkit.serving import require_http_stack

    require_http_stack()
    from nmtkit.serving.app import serve as run_server
    from nmtkit.translate_files import resolve_options

    limits = Limits(max_body_bytes=max_body_bytes, max_lines=max_lines, max_line_chars=max_line_chars,
                    max_beam=max_beam, max_search_bytes=max_search_bytes, read_timeout_s=read_timeout,
                    request_timeout_s=request_timeout, max_queued=max_queued, max_connections=max_connections)
    # one search call at a time: --max-search-bytes bounds each call's memory
    options = resolve_options(model, vars(decode_flags), largest_beam=max_beam, workers=1, **opts.settings(run_flags))
    run_server([str(m) for m in model], options, limits, host, port, batch_window_ms, _console(),
               verbose=_state["verbosity"] > 0, api_key=api_key)


@app.command(cls=_Command)
def score(
    ctx: typer.Context,
    ref: List[Path] = typer.Option(..., "-r", "--ref", help="Reference file (repeat for several references)."),
    input: Optional[Path] = typer.Option(None, "-i", "--input", help="Hypotheses (default: stdin)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="A second system's hypotheses: paired significance test."),
    metrics: str = typer.Option("bleu,chrf,ter", "--metrics", help="Comma-separated: bleu, chrf, chrf++ (word "
                                "bigrams too), ter, comet (needs --comet-model and --source)."),
    tokenize: Optional[str] = typer.Option(None, "--tokenize", "-tok", show_default=False,
                                           help="BLEU's tokenizer (sacreBLEU's -tok; TER reads it only to split "
                                           "Chinese, Japanese and Korean): 13a, intl, zh, ja-mecab, ko-mecab, char, "
                                           "flores101, flores200, spBLEU-1K, none (default: from --target-lang, "
                                           "else 13a). Needs bleu or ter in --metrics."),
    target_lang: Optional[str] = typer.Option(None, "--target-lang", "-l", show_default=False,
                                              help="Language of the references (zh, ja, ko, ...): chooses the "
                                              "tokenizer when --tokenize is not given. Needs bleu or ter in "
                                              "--metrics."),
    segments: Optional[Path] = typer.Option(None, "--segments", show_default=False,
                                            help="Also write each line's scores to FILE as JSON lines."),
    source: Optional[Path] = typer.Option(None, "-s", "--source", show_default=False,
                                          help="The source sentences, which COMET reads (--metrics comet only)."),
    comet_model: Optional[str] = typer.Option(None, "--comet-model", show_default=False,
                                              help="A local COMET model directory (DIR/checkpoints/model.ckpt)."),
    comet_batch_size: int = typer.Option(16, "--comet-batch-size", help="Sentences per COMET batch (--metrics "
                                         "comet only)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    tokenized_bleu: bool = typer.Option(False, "--tokenized-bleu", help="Also report paper-style tokenized, compound-split BLEU (not comparable to sacreBLEU)."),
    test: Optional[str] = typer.Option(None, "--test", show_default=False, help="Significance test with --baseline: "
                                       "bootstrap (default) or ar (approximate randomisation)."),
    resamples: Optional[int] = typer.Option(None, "--resamples", show_default=False,
                                            help="Bootstrap resamples / randomisation trials with --baseline "
                                            "(default 1000)."),
    lowercase: bool = typer.Option(False, "--lowercase", help="Case-insensitive scoring."),
    alpha: Optional[float] = typer.Option(None, "--alpha", show_default=False,
                                          help="Significance level with --baseline (default 0.05): a system is named better "
                                          "only when p < alpha; intervals are (1 - alpha) confidence intervals."),
) -> None:
    """Score hypotheses against references with sacreBLEU (BLEU, chrF, chrF++, TER) and COMET."""
    from nmtkit.scoring.report import ScoreOptions, score_command

    options = ScoreOptions(metrics=tuple(m.strip() for m in metrics.split(",") if m.strip()), tokenize=tokenize or "",
                           target_lang=target_lang or "", lowercase=lowercase, comet_model=comet_model or "",
                           comet_batch_size=comet_batch_size)
    no_comet, no_tokenizer = "comet" not in options.metrics, not options.reads_tokenizer
    unread = "is read by --metrics bleu and ter only (ter: to split Chinese, Japanese and Korean): add one of them " \
             "or leave it out"
    _refuse_unused(ctx, [("source", no_comet, "is for --metrics comet (COMET reads the source sentences): add comet "
                          "to --metrics or leave it out"),
                         ("comet_batch_size", no_comet, "is for --metrics comet: add comet to --metrics or leave it out"),
                         ("tokenize", no_tokenizer, unread), ("target_lang", no_tokenizer, unread)])
    score_command(
        refs=ref, hyp=input, baseline=baseline, options=options, as_json=json_out, tokenized_bleu=tokenized_bleu,
        test=test, resamples=resamples, console=_console(), alpha=alpha, sources=source, segments=segments,
    )


@app.command(cls=_Command)
def run(recipe: Path = RecipeArg, overrides: Optional[List[str]] = OverridesArg) -> None:
    """Run a recipe end to end: prepare, train, average, translate dev and test, score both."""
    cfg = _load(recipe, overrides)
    from nmtkit.pipeline import run_recipe

    run_recipe(cfg, _console())


@app.command(cls=_Command)
def sweep(
    sweep_file: Path = typer.Argument(..., help="YAML sweep file: a base recipe and its variants (see recipes/sweeps/).",
                                      show_default=False),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only this variant (repeat for several).",
                                             show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the variants with their parameter counts; run nothing."),
    seeds: Optional[str] = typer.Option(None, "--seeds", metavar="<1,2,3>", show_default=False,
                                        help="Run every variant once per training seed (replaces the file's seeds)."),
    splits: Optional[int] = typer.Option(None, "--splits", metavar="<K>", show_default=False,
                                         help="... and once per data split 0..K-1 (data.split_seed; 0 is the "
                                              "recipe's own split; replaces the file's splits)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", metavar="<variant>", show_default=False,
                                           help="The variant the p-values test against (default: the file's "
                                                "`baseline:`, else the first variant)."),
) -> None:
    """Run every variant of a recipe (each as `nmtkit run`) and tabulate them with significance tests."""
    from nmtkit.sweep.replication import parse_seeds
    from nmtkit.sweep.spec import load_sweep

    plan = load_sweep(sweep_file, parse_seeds(seeds) if seeds is not None else None, splits, baseline)
    from nmtkit.sweep.runner import run_sweep

    run_sweep(plan, _console(), only=only, dry_run=dry_run, debug=_state["debug"])


@app.command(cls=_Command)
def verses(
    module: str = typer.Argument(..., help="Installed SWORD module, e.g. KJV (Debian sword-text-kjv).", show_default=False),
    output: opts.Output = None,
    exclude: List[Path] = typer.Option([], "--exclude", metavar="<prepared dir>", show_default=False,
                                       help="Leave out the dev and test verses of this prepared/ directory "
                                            "(repeatable): another translation of them would leak their meaning."),
    testament: str = typer.Option("all", "--testament", help="all, old or new."),
    sword_path: Path = typer.Option(Path("/usr/share/sword"), "--sword-path", help="Where the modules are installed."),
    refs: Optional[str] = typer.Option(None, "--refs", metavar="<path>", show_default=False,
                                       help="Also write each verse's reference, line by line with the text (- for stdout, when the text goes to a file)."),
) -> None:
    """Write the verses of a SWORD Bible one a line: monolingual text for back-translation."""
    from nmtkit.data.verses import export_verses

    report = export_verses(module, output, exclude, testament, sword_path, refs)
    dropped = ", ".join(f"{count:,} {why}" for why, count in report["dropped"].items() if count)
    console = _console()
    for note in report["notes"]:
        console.warn(note)
    console.info(f"{report['written']:,} verses of {module} written ({report['excluded']:,} held-out verses "
                 f"left out{', ' + dropped + ' skipped' if dropped else ''})")


@app.command(cls=_Command)
def average(
    run_dir: Path = typer.Argument(..., help="Training run directory (holds checkpoints/)."),
    last: Optional[int] = typer.Option(None, "--last", min=1, show_default=False,
                                       help="Average the last N checkpoints (default: the run's train.average_last; "
                                            "all of them, with a warning, when fewer exist)."),
    output: Optional[str] = typer.Option(None, "-o", "--output", metavar="<path>", show_default=False,
                                         help="Model directory to write (default: RUN_DIR/averaged); an existing "
                                              "directory is replaced only if it is a complete model directory."),
    upto: Optional[int] = typer.Option(None, "--upto", min=1, show_default=False,
                                       help="Only checkpoints up to this step: the model a run of that many updates "
                                            "ended with (a learning curve from one long run)."),
) -> None:
    """Average the weights of the last N checkpoints into a model directory."""
    from nmtkit.training.checkpoint import average_checkpoints

    console = _console()
    console.info(f"wrote {average_checkpoints(run_dir, last, output, warn=console.warn, upto=upto)}")


@app.command(cls=_Command)
def plot(
    run_dirs: List[Path] = typer.Argument(..., help="Training run directories (WORKDIR/train), several overlaid, "
                                          "or a sweep directory (all its variants).", show_default=False),
    output: str = typer.Option("curves.png", "-o", "--output", metavar="<path>",
                               help="Image to write; its suffix picks the format (png, pdf, svg)."),
    x: str = typer.Option("step", "--x", help="x axis: step (updates) or time (training wall time)."),
    size: str = typer.Option("1200x800", "--size", help="Image size in pixels, WIDTHxHEIGHT."),
) -> None:
    """Plot training loss, dev loss, dev BLEU and learning rate of one or more runs (a sweep over seeds
    and splits: each variant's mean with error bars of one standard deviation, and its test BLEU)."""
    from nmtkit.sweep.plan import sweep_groups, sweep_runs
    from nmtkit.viz.curves import plot_curves
    from nmtkit.viz.figure import parse_size

    labels = None
    if len(run_dirs) == 1 and (groups := sweep_groups(run_dirs[0])) is not None:
        from nmtkit.viz.spread import plot_spread

        _console().info(f"wrote {plot_spread(groups, output, x=x, size=parse_size(size))}")
        return
    if len(run_dirs) == 1 and (runs := sweep_runs(run_dirs[0])) is not None:
        labels, run_dirs = [name for name, _ in runs], [path for _, path in runs]
    _console().info(f"wrote {plot_curves(run_dirs, output, x=x, size=parse_size(size), labels=labels)}")


@app.command(cls=_Command)
def attention(
    sentence: str = typer.Argument(..., help="Source sentence to translate.", show_default=False),
    model: Path = typer.Option(..., "-m", "--model", help="Model directory."),
    output: Optional[str] = typer.Option(None, "-o", "--output", metavar="<path>", show_default=False,
                                         help="File to write: the image (default attention.png; its suffix picks "
                                         "the format: png, pdf, svg), or with --format json the JSON (default: "
                                         "stdout)."),
    layer: Optional[int] = typer.Option(None, "--layer", help="Decoder layer, numbered from 1 (default: the last).",
                                        show_default=False),
    head: Optional[int] = typer.Option(None, "--head", help="Head, numbered from 1 (default: the mean over heads).",
                                       show_default=False),
    grid: bool = typer.Option(False, "--grid", help="Every head of the layer, one panel each."),
    fmt: str = typer.Option("png", "--format", help="png: draw the image at -o; json: pieces and matrix, to -o or "
                            "stdout."),
    beam_size: Optional[int] = typer.Option(None, "--beam-size", "-b", min=1, show_default=False,
                                            help="Beam size of the translation (default: the model's, as translate)."),
    size: Optional[str] = typer.Option(None, "--size", help="Image size WIDTHxHEIGHT in pixels (default: fits the "
                                       "sentence); not with --format json.", show_default=False),
    device: str = typer.Option("cpu", "--device", help="auto, cpu, cuda or cuda:N."),
    target_lang: opts.TargetLang = opts.DEFAULTS.target_lang,
) -> None:
    """Translate one sentence as translate --dtype float32 does and show its source x target attention (SentencePiece pieces)."""
    from nmtkit.viz.attention import attention_command
    from nmtkit.viz.figure import parse_size

    attention_command(model, sentence, output, layer, head, grid, fmt, beam_size,
                      parse_size(size) if size is not None else None, device, _console(), target_lang)


@app.command(cls=_Command)
def info(
    model_dir: Path = typer.Argument(..., help="Model directory (e.g. WORKDIR/train/best).", show_default=False),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Show a model card: architecture, size, vocabularies, languages, training, data and recipe."""
    from nmtkit.card import info_command

    info_command(model_dir, json_out, _console().warn)


@app.command("import", cls=_Command)
def import_model(
    source: str = typer.Argument(..., metavar="SRC", show_default=False,
                                 help="A Hugging Face MarianMT directory (OPUS-MT), or a Hub id such as "
                                      "Helsinki-NLP/opus-mt-en-de (needs huggingface_hub: nmtkit[hf])."),
    output: str = typer.Option(..., "-o", "--output", metavar="<path>", show_default=False,
                               help="Model directory to write; an existing directory is replaced only if it "
                                    "is a complete nmtkit model directory."),
) -> None:
    """Import a pretrained MarianMT model: translate, serve, fine-tune and export it like one trained here."""
    from nmtkit.pretrained.marian_import import import_marian

    _console().info(f"wrote {import_marian(source, output)}")


@app.command(cls=_Command)
def export(
    model_dir: Path = typer.Argument(..., help="Model directory (e.g. WORKDIR/train/best).", show_default=False),
    output: str = typer.Option(..., "-o", "--output", metavar="<path>", show_default=False,
                               help="Directory to write; an existing directory is replaced only if it is a "
                                    "complete export of the same format."),
    fmt: str = typer.Option("ctranslate2", "--format", help="Export format: ctranslate2, or marian (a Hugging "
                            "Face MarianMT directory for transformers)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="Weight type: int8, float16, bfloat16, float32 (default: float32).", show_default=False),
) -> None:
    """Export a Transformer for another engine: CTranslate2 (translate it with --engine ctranslate2) or MarianMT."""
    from nmtkit.errors import ConfigError

    if fmt not in ("ctranslate2", "marian"):
        raise ConfigError(f"--format must be ctranslate2 or marian, not {fmt!r}")
    if fmt == "marian":
        if quantization is not None:
            raise ConfigError("--quantization is for --format ctranslate2; a MarianMT export keeps float32 weights")
        from nmtkit.pretrained.marian_export import export_marian

        _console().info(f"wrote {export_marian(model_dir, output)}")
        return
    from nmtkit.ctranslate2.export import export_ctranslate2

    _console().info(f"wrote {export_ctranslate2(model_dir, output, quantization)}")


class _Terminated(BaseException):
    """SIGTERM as an exception, so ``finally`` blocks remove temporary files on the way out."""


def _terminate(signum, frame) -> None:
    raise _Terminated()


def _caused_by_ctrl_c(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the exceptions that led to ``err``."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def main() -> None:
    """Entry point. SIGTERM becomes a clean exit 143 (temporary files removed on the way out)
    while the app runs, unless the caller ignores it or handles it itself; called in-process,
    the default disposition is put back afterwards."""
    ours = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # not ignored, no caller's own handler
    if ours:
        signal.signal(signal.SIGTERM, _terminate)  # training installs its own, for a clean stop
    try:
        _run_app()
    finally:
        if ours:  # called in-process (tests, a script): leave the caller's default as it was
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def program() -> None:
    """The ``nmtkit`` command itself (console script, ``python -m nmtkit``): ``main``, then every
    object the garbage collector tracks frozen, so that the interpreter's exit does not collect
    over torch's objects again and again (a fifth of a second and more at the end of a command
    that imported torch: benchmarks/RESULTS.md, "a quicker exit"). Objects in reference cycles are
    then never finalized, so nmtkit closes what it writes before ``main`` returns and relies on no
    ``__del__`` (tests/test_startup.py checks that); stdout and stderr are flushed at exit as before.
    In-process callers (tests, scripts) call ``main`` and keep their collector as it was."""
    try:
        main()
    finally:
        gc.freeze()


def _run_app() -> None:
    """The app, with its errors as one line and an exit code."""
    from nmtkit.errors import NmtkitError, user_os_error

    try:
        app()
    except NmtkitError as err:
        if _state["debug"]:
            raise
        from nmtkit.runtime.console import one_line

        print(f"nmtkit: error: {one_line(str(err))}", file=sys.stderr)
        sys.exit(err.exit_code)
    except OSError as err:
        known = None if _state["debug"] else user_os_error(err)  # a full disk, workdir=a file, ...
        if known is None:
            raise
        from nmtkit.runtime.console import one_line

        print(f"nmtkit: error: {one_line(known[0])}", file=sys.stderr)
        sys.exit(known[1])
    except KeyboardInterrupt:
        print("nmtkit: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as err:  # Typer turns Ctrl-C into a silent exit 130: say why (training says its own)
        if err.code == 130 and _caused_by_ctrl_c(err):
            print("nmtkit: interrupted", file=sys.stderr)
        raise
    except _Terminated:
        print("nmtkit: terminated", file=sys.stderr)
        sys.exit(143)
