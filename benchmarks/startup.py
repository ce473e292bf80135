"""Start-up costs a user feels: ``nmtkit --help`` and the time to a first translation
(``nmtkit translate`` on one line from stdin: process start, imports, model load, one
search, exit), with the torch engine and with CTranslate2 on the exported model.
Each command runs ``--repeats`` times in a fresh process; the median and the fastest are kept.

    python benchmarks/startup.py --model WORKDIR/train/best --data WORKDIR/prepared
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
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
               timed("first translation, torch", translate, args, line)]
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
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    common.write_results(Path(args.out), "startup", records, [
        ("what", "what"), ("median_s", "median s"), ("min_s", "fastest s"), ("peak_rss_mib", "peak RSS MiB"),
        ("repeats", "runs"), ("load_before", "load before")],
        "Start-up: --help and time to first translation (one line, beam 4)",
        [f"Model {args.model}; threads {args.threads}."])
    for record in records:
        print(json.dumps(record), file=sys.stderr)
    return records


if __name__ == "__main__":
    main()
