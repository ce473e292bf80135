"""Start-up costs a user feels: ``nmtkit --help`` and the time to a first translation
(``nmtkit translate`` on one line from stdin: process start, imports, model load, one
search, exit), with the torch engine and with CTranslate2 on the exported model; and
launch-to-first-line, the time from starting ``nmtkit translate`` to its first output line
on stdout, for the two ways a shell user gives one line: piped (``echo LINE | nmtkit translate
-m MODEL``) and as a file (``nmtkit translate -m MODEL -i FILE``).
Each command runs ``--repeats`` times in a fresh process; the median and the fastest are kept.

    python benchmarks/startup.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common


def timed(name: str, argv: list[str], args, stdin: bytes = b"") -> dict:
    walls, rss = [], []
    load_before = common.load_average()
    for _ in range(args.repeats):
        done = common.run_child(argv, threads=args.threads, stdin=stdin)
        if done["returncode"] != 0:
            raise RuntimeError(f"{name} failed:\n{done['stderr'][-2000:]}")
        walls.append(done["wall_s"])
        rss.append(done["peak_rss_mib"])
    return {"what": name, "median_s": round(statistics.median(walls), 3), "min_s": min(walls),
            "peak_rss_mib": max(rss), "repeats": args.repeats, "load_before": load_before,
            "command": " ".join(["nmtkit", *argv[3:]])}


def launch_to_first_line(argv: list[str], stdin: bytes | None) -> float:
    """Seconds from starting ``argv`` to the first line it writes to stdout (``stdin``: written
    to its stdin and closed, as ``echo`` does; None: stdin left empty). No OMP_NUM_THREADS: the
    command chooses its threads as it does for a user (``--threads 0``, auto)."""
    env = common.child_env(None)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(key, None)
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty stderr cannot block the child
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                cwd=common.REPO)
        try:
            proc.stdin.write(stdin or b"")
            proc.stdin.close()
            line = proc.stdout.readline()
            seconds = time.perf_counter() - start
            proc.stdout.read()
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0 or not line:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)} failed:\n{err.read().decode('utf-8', 'replace')[-2000:]}")
    return seconds


def first_line_records(args, translate: list[str], line: bytes, label: str = "") -> list[dict]:
    """Launch-to-first-line, piped and from a file, the two runs alternating so that a change in
    the machine's load falls on both alike; ``label`` goes after the way in each row's name."""
    scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-first-line-"))
    try:
        source = scratch / "line.txt"
        source.write_bytes(line)
        ways = {"piped": (translate, line), "file": ([*translate, "-i", str(source)], None)}
        load_before = common.load_average()
        seconds = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, (argv, stdin) in ways.items():
                seconds[way].append(launch_to_first_line(argv, stdin))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    shown = {"piped": "echo LINE | " + " ".join(["nmtkit", *translate[3:]]),
             "file": " ".join(["nmtkit", *translate[3:], "-i", "FILE"])}
    return [{"what": f"launch to first line, {way}{label}", "median_s": round(statistics.median(seconds[way]), 3),
             "min_s": round(min(seconds[way]), 3), "repeats": args.repeats, "load_before": load_before,
             "command": shown[way]} for way in ways]


def first_line(data: Path, model: Path) -> bytes:
    meta = json.loads((model / "config.json").read_text(encoding="utf-8"))
    path = data / f"test.{meta.get('src_lang', 'en')}"
    return (path.read_text(encoding="utf-8").splitlines()[0] + "\n").encode("utf-8")


def main(argv=None) -> list[dict]:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    nmtkit = [common.python(), "-m", "nmtkit"]
    line = first_line(Path(args.data), Path(args.model))
    translate = [*nmtkit, "-q", "translate", "-m", args.model, "--device", args.device]
    records = [timed("nmtkit --help", [*nmtkit, "--help"], args),
               timed("first translation, torch", translate, args, line),
               *first_line_records(args, translate, line)]
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("skipping ctranslate2: not installed", file=sys.stderr)
    else:
        from nmtkit.ctranslate2.export import export_ctranslate2

        scratch = Path(tempfile.mkdtemp(prefix="nmtkit-bench-start-"))
        try:
            ct2 = str(export_ctranslate2(args.model, scratch / "ct2"))
            records.append(timed("first translation, ctranslate2",
                                 [*nmtkit, "-q", "translate", "-m", ct2, "--engine", "ctranslate2", "--device",
                                  args.device], args, line))
            records.append(timed("first translation, ctranslate2 int8",
                                 [*nmtkit, "-q", "translate", "-m", ct2, "--engine", "ctranslate2", "--device",
                                  args.device, "--dtype", "int8"], args, line))
            # the export as a user translates it: --engine auto picks CTranslate2, which runs without torch
            records += first_line_records(args, [*nmtkit, "-q", "translate", "-m", ct2, "--device", args.device],
                                          line, ", ctranslate2 export")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    common.write_results(Path(args.out), "startup", records, [
        ("what", "what"), ("median_s", "median s"), ("min_s", "fastest s"), ("peak_rss_mib", "peak RSS MiB"),
        ("repeats", "runs"), ("load_before", "load before"), ("command", "command")],
        "Start-up: --help and time to first translation (one line, beam 4)",
        [f"Model {args.model}; threads {args.threads}, except launch to first line (no OMP_NUM_THREADS: "
         f"translate's auto threads, as a user runs it)."])
    for record in records:
        print(json.dumps(record), file=sys.stderr)
    return records


if __name__ == "__main__":
    main()
