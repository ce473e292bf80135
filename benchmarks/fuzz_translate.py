"""Fuzz ``translate`` with generated lines: one output line per input line, whatever the bytes.

    python benchmarks/fuzz_translate.py --lines 20000 --seed 1 [--json out.json]

Builds a tiny random Transformer (the test suite's), writes ``--lines`` generated lines to a
file (the fuzz corpus of tests/test_robustness.py, random code points from every plane,
combining marks, bidi and zero-width characters, NUL and other controls, U+2028/U+0085
inside lines, lone \\r, lines of spaces, lines up to 10,000 characters, and lines of random
bytes that are not UTF-8; \\n and \\r\\n endings mixed; no final newline) and checks:

- ``--errors replace`` (file -> file and file -> stdout through the CLI): as many output lines
  as the file has \\n-separated lines, none containing a tab or anything ``str.splitlines``
  splits on, blank inputs giving blank outputs, and a sample equal to translating each line
  alone (batching changes nothing);
- ``--errors strict``: a one-line error naming the first line that is not UTF-8, exit 2,
  and no output file.
Prints (and with ``--json`` writes) counts and timings.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from conftest import save_tiny_model, tiny_sentences  # noqa: E402
from test_robustness import NASTY_LINES  # noqa: E402

SPECIAL = ("\x00\x01\x07\x1b\x7f\x85\xa0\u0300\u0301\u036f\u200b\u200d\u200e\u200f\u202a\u202e\u2028\u2029"
           "\u2066\ufeff\ufffd")  # controls, combining marks, zero-width, bidi, line separators, BOM


def random_char(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.4:
        return rng.choice("the cat dog sat on a mat ")
    if roll < 0.6:
        return rng.choice(SPECIAL)
    if roll < 0.8:
        return chr(rng.randrange(0x20, 0x3000))  # Latin to CJK punctuation, combining marks, RTL scripts
    code = rng.randrange(0x110000)
    return chr(code) if not (0xD800 <= code <= 0xDFFF or code == 0x0A) else "\ufffd"  # any plane; no surrogates, no \n


def random_line(rng: random.Random) -> bytes:
    """One line's bytes (no \\n); some are not UTF-8."""
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(NASTY_LINES).replace("\n", " ").encode("utf-8")
    if roll < 0.20:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))).replace(b"\n", b"")
    if roll < 0.22:
        return ("".join(random_char(rng) for _ in range(rng.randint(1000, 10_000)))).encode("utf-8")
    if roll < 0.27:
        return b" " * rng.randint(0, 20)
    return "".join(random_char(rng) for _ in range(rng.randint(0, 60))).encode("utf-8")


def corpus(count: int, seed: int) -> bytes:
    rng = random.Random(seed)
    lines = [random_line(rng) for _ in range(count)]
    endings = [b"\r\n" if rng.random() < 0.3 else b"\n" for _ in range(count - 1)]
    return b"".join(line + end for line, end in zip(lines, endings)) + lines[-1]  # no final newline


def file_lines(content: bytes) -> list[str]:
    """The lines a reader splitting on \\n only sees, decoded as ``--errors replace`` does."""
    raw = content.split(b"\n")
    raw = raw[:-1] if raw[-1] == b"" else raw
    return [line.decode("utf-8", errors="replace").rstrip("\r") for line in raw]


def invalid_line_numbers(content: bytes) -> list[int]:
    numbers = []
    for number, line in enumerate(content.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            numbers.append(number)
    return numbers


def check_outputs(outputs: list[str], inputs: list[str]) -> list[str]:
    problems = []
    if len(outputs) != len(inputs):
        problems.append(f"{len(outputs)} output lines for {len(inputs)} input lines")
    for number, (text, line) in enumerate(zip(outputs, inputs), 1):
        if "\t" in text or len(text.splitlines()) > 1:
            problems.append(f"line {number}: output splits into several lines: {text!r}")
        if not line.strip() and text:
            problems.append(f"line {number}: blank input, non-blank output {text!r}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sample", type=int, default=300, help="lines also translated one by one")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()

    import torch

    from nmtkit.data.vocab import train_spm
    from nmtkit.decoding.translate import TranslateOptions, translate_lines
    from nmtkit.modeldir import load_model_dir
    from nmtkit.runtime.console import NmtConsole
    from nmtkit.translate_files import translate_file

    torch.set_num_threads(1)
    options = TranslateOptions(beam_size=2, max_len_a=0.0, max_len_b=3, device="cpu", dtype="float32",
                               errors="replace")
    cli_options = ["-b", "2", "--max-len-a", "0", "--max-len-b", "3", "--device", "cpu", "--dtype", "float32"]
    report: dict = {"lines": args.lines, "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="nmtkit-fuzz-") as tmp:
        tmp = Path(tmp)
        train_spm(tiny_sentences(600), tmp / "spm.model", vocab_size=40)
        model = save_tiny_model(tmp / "model", tmp / "spm.model", seed=0)
        content = corpus(args.lines, args.seed)
        (tmp / "in.txt").write_bytes(content)
        inputs = file_lines(content)
        report.update(bytes=len(content), file_lines=len(inputs), invalid_utf8_lines=len(invalid_line_numbers(content)),
                      crlf_lines=content.count(b"\r\n"), longest_line=max(map(len, inputs)))

        start = time.perf_counter()
        translate_file([str(model)], tmp / "in.txt", tmp / "out.txt", options, NmtConsole(verbosity=-1))
        report["api_seconds"] = round(time.perf_counter() - start, 1)
        written = (tmp / "out.txt").read_bytes().decode("utf-8")
        outputs = written.split("\n")[:-1] if written.endswith("\n") else written.split("\n") + ["<no final newline>"]
        problems = check_outputs(outputs, inputs)

        rng = random.Random(args.seed)
        loaded = [load_model_dir(model)]
        sample = rng.sample(range(len(inputs)), min(args.sample, len(inputs)))
        alone = [translate_lines(loaded, [inputs[i]], options)[0] for i in sample]
        problems += [f"line {i + 1}: batched {outputs[i]!r} != alone {text!r}"
                     for i, text in zip(sample, alone) if outputs[i] != text]

        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        start = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "nmtkit", "translate", "-m", str(model), "-i", str(tmp / "in.txt"),
                              "--errors", "replace", *cli_options], capture_output=True, env=env)
        report["cli_seconds"] = round(time.perf_counter() - start, 1)
        if cli.returncode != 0 or cli.stdout.decode("utf-8") != written:
            problems.append(f"CLI stdout differs from the API output (exit {cli.returncode}): {cli.stderr[-300:]!r}")

        strict = subprocess.run([sys.executable, "-m", "nmtkit", "translate", "-m", str(model), "-i",
                                 str(tmp / "in.txt"), "-o", str(tmp / "strict.txt"), *cli_options],
                                capture_output=True, env=env)
        err = strict.stderr.decode("utf-8", errors="replace").strip()
        expected = f"line {invalid_line_numbers(content)[0]} is not valid UTF-8"
        report["strict_error"] = err
        if strict.returncode != 2 or expected not in err or "\n" in err or (tmp / "strict.txt").exists():
            problems.append(f"strict mode: exit {strict.returncode}, {err!r} (expected one line with {expected!r})")

    report.update(api_lines_per_second=round(args.lines / report["api_seconds"], 1), sample_checked=len(sample),
                  problems=len(problems), first_problems=problems[:10])
    text = json.dumps(report, indent=1, ensure_ascii=False)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
