"""Latency of one line through ``nmtkit translate --stream``: the time from writing a line to
the process's stdin to reading its translation from its stdout, the model loaded and warm
(start-up is ``startup.py``'s figure).

    python benchmarks/stream_latency.py --model WORKDIR/train/averaged --data WORKDIR/prepared --lines 200

Sends ``--warmup`` + ``--lines`` test sentences one at a time (the next written only once the
previous answer is read), times the last ``--lines``, and checks every answer against batch
``nmtkit translate`` of the same lines (exit 1 when one differs). Writes stream_latency.json
and .md: p50, p90, p99, max and mean latency in ms, with the mean source length in words.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common


def source_lines(data: Path, model: Path, count: int) -> list[str]:
    """The first ``count`` non-empty lines of the prepared test set's source side."""
    meta = json.loads((model / "config.json").read_text(encoding="utf-8"))
    text = (data / f"test.{meta.get('src_lang', 'en')}").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()][:count]
    if len(lines) < count:
        raise SystemExit(f"the test set has {len(lines)} non-empty lines; asked for {count}")
    return lines


def stream_answers(command: list[str], lines: list[str], threads: int,
                   timeout_s: float) -> tuple[list[str], list[float]]:
    """Each line's answer from one ``--stream`` process, and its latency in seconds."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*command, "--stream"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                env=common.child_env(threads), cwd=common.REPO)
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        answers, latencies = [], []
        try:
            for line in lines:
                start = time.perf_counter()
                proc.stdin.write(line.encode("utf-8") + b"\n")
                proc.stdin.flush()
                answer = proc.stdout.readline()
                latencies.append(time.perf_counter() - start)
                if not answer:
                    err.seek(0)
                    raise RuntimeError(f"no answer to line {len(answers) + 1}:\n{err.read().decode()[-2000:]}")
                answers.append(answer.decode("utf-8").rstrip("\n"))
            proc.stdin.close()
            if proc.wait(timeout=60) != 0:
                raise RuntimeError(f"translate --stream exited with {proc.returncode}")
        finally:
            watchdog.cancel()
            proc.kill()
    return answers, latencies


def batch_answers(command: list[str], lines: list[str], threads: int) -> list[str]:
    done = common.run_child(command, threads=threads, stdin="".join(line + "\n" for line in lines).encode("utf-8"))
    if done["returncode"] != 0:
        raise RuntimeError(f"batch translate failed:\n{done['stderr'][-2000:]}")
    return done["stdout"].split("\n")[:-1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200, help="lines timed")
    parser.add_argument("--warmup", type=int, default=5, help="lines sent first, not timed")
    parser.add_argument("--beam-size", type=int, help="default: the model's")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the stream is killed")
    args = parser.parse_args(argv)
    lines = source_lines(Path(args.data), Path(args.model), args.warmup + args.lines)
    command = [common.python(), "-m", "nmtkit", "-q", "translate", "-m", args.model, "--device", args.device,
               *(["--beam-size", str(args.beam_size)] if args.beam_size else [])]
    load_before = common.load_average()
    answers, latencies = stream_answers(command, lines, args.threads, args.timeout)
    reference = batch_answers(command, lines, args.threads)
    mismatches = sum(a != b for a, b in zip(answers, reference)) + abs(len(answers) - len(reference))
    timed = [seconds * 1000 for seconds in latencies[args.warmup:]]
    words = statistics.mean(len(line.split()) for line in lines[args.warmup:])
    record = {"lines": args.lines, "mean_src_words": round(words, 1),
              "p50_ms": round(percentile(timed, 0.5), 2), "p90_ms": round(percentile(timed, 0.9), 2),
              "p99_ms": round(percentile(timed, 0.99), 2), "max_ms": round(max(timed), 2),
              "mean_ms": round(statistics.mean(timed), 2), "answers_equal_batch": mismatches == 0,
              "threads": args.threads, "device": args.device, "load_before": load_before,
              "command": " ".join(["nmtkit", *command[3:], "--stream"])}
    columns = [("lines", "lines"), ("mean_src_words", "source words"), ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"),
               ("p99_ms", "p99 ms"), ("max_ms", "max ms"), ("mean_ms", "mean ms"), ("threads", "threads"),
               ("answers_equal_batch", "= batch")]
    common.write_results(Path(args.out), "stream_latency", [record], columns, "One line through translate --stream",
                         [f"Command: `{record['command']}`; latency = write of a line to read of its answer, "
                          f"after {args.warmup} warm-up lines."])
    print(json.dumps(record))
    if mismatches:
        print(f"{mismatches} streamed answer(s) differ from batch translate", file=sys.stderr)
        sys.exit(1)
    return [record]


if __name__ == "__main__":
    main()
