"""Test and dev BLEU against updates, from long training runs: where two models cross.

For each run (a work directory of `nmtkit run`, trained with a large ``train.keep_last``) and
each requested step that has its checkpoints, the model a run of that many updates ends with is
rebuilt (`nmtkit average --upto STEP`, the recipe's average of the last checkpoints), translates
dev and test, and is scored. Points already in the output JSON are kept, so a run that was
still training can be measured again later; the figure is redrawn from every point. Each point
also keeps the training minutes its run had spent at that step, and OUT-minutes.png draws test
BLEU against them (meaningful for runs trained one after the other on one idle machine).

    python benchmarks/learning_curve.py --run "LSTM=data/l-curve" --run "Transformer=data/t-curve" \\
        --steps 600,1200,2400,4800 --out docs/bleu-vs-updates
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import REPO, child_env, load_average, machine, python

from nmtkit.storage.files import atomic_write_text


def nmtkit(*args: str, threads: int) -> str:
    done = subprocess.run([python(), "-m", "nmtkit", "-q", *args], capture_output=True, text=True,
                          env=child_env(threads), cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"nmtkit {' '.join(args)} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def has_step(workdir: Path, step: int, average: int) -> bool:
    """The checkpoints the average of a ``step``-update run needs are all there."""
    from nmtkit.training.checkpoint import checkpoint_dirs, checkpoint_step

    upto = sorted(s for s in map(checkpoint_step, checkpoint_dirs(workdir / "train")) if s <= step)
    return bool(upto) and upto[-1] == step and len(upto) >= average


def measure(label: str, workdir: Path, step: int, models: Path, average: int, threads: int) -> dict:
    model = models / f"{label}-{step}"
    if not (model / "model.safetensors").exists():
        nmtkit("average", str(workdir / "train"), "--last", str(average), "--upto", str(step), "-o", str(model),
               threads=threads)
    point = {"label": label, "step": step, "workdir": str(workdir), "load_average": load_average(),
             "train_minutes": train_minutes(workdir, step)}
    src, tgt = _langs(workdir)
    for split in ("dev", "test"):
        hyp = models / f"{label}-{step}.{split}.hyp"
        nmtkit("translate", "-m", str(model), "-i", str(workdir / "prepared" / f"{split}.{src}"), "-o", str(hyp),
               threads=threads)
        scores = json.loads(nmtkit("score", "-r", str(workdir / "prepared" / f"{split}.{tgt}"), "-i", str(hyp),
                                   "--json", threads=threads))["scores"]
        point[split] = {name: round(value["score"], 2) for name, value in scores.items()}
    return point


def train_minutes(workdir: Path, step: int) -> float | None:
    """Training wall-clock minutes the run had spent when it saved its checkpoint of ``step``
    (the trainer state carries them across resumes): the x of BLEU per minute. Comparable
    between runs only on one idle machine with the same threads. None without that checkpoint."""
    from nmtkit.training.checkpoint import checkpoint_dirs, checkpoint_step, read_trainer_state

    for path in checkpoint_dirs(workdir / "train"):
        if checkpoint_step(path) == step:
            return round(read_trainer_state(path).train_seconds / 60, 2)
    return None


def _langs(workdir: Path) -> tuple[str, str]:
    languages = json.loads((workdir / "prepared" / "manifest.json").read_text(encoding="utf-8"))["languages"]
    return languages["src"], languages["tgt"]


def plot(points: list[dict], path: Path, x: str = "updates") -> None:
    """Test BLEU of every run against updates (log scale) or training minutes (points measured
    before minutes were recorded are left out of the minutes figure)."""
    from nmtkit.viz.figure import new_figure, save_figure

    at = (lambda p: p["step"]) if x == "updates" else (lambda p: p.get("train_minutes"))
    points = [p for p in points if at(p) is not None]
    fig = new_figure(900, 560)
    ax = fig.add_subplot(1, 1, 1)
    colours = {}
    for label in dict.fromkeys(p["label"] for p in points):
        mine = sorted((at(p), p["test"]["bleu"]) for p in points if p["label"] == label)
        line, = ax.plot([s for s, _ in mine], [b for _, b in mine], marker="o", label=label)
        colours[label] = line.get_color()
    bleus = [p["test"]["bleu"] for p in points]
    gap = 0.04 * (max(bleus) - min(bleus) or 1.0)
    xs = sorted({at(p) for p in points})
    nudge = (lambda v: v * 1.04) if x == "updates" else (lambda v: v + 0.02 * (xs[-1] or 1.0))
    for where in xs:
        # top to bottom at each x, each number at least `gap` below the one above: no overprinting
        previous = float("inf")
        for p in sorted((p for p in points if at(p) == where), key=lambda p: -p["test"]["bleu"]):
            y = min(p["test"]["bleu"], previous - gap)
            previous = y
            ax.annotate(f"{p['test']['bleu']:.1f}", (where, p["test"]["bleu"]), xytext=(nudge(where), y),
                        textcoords="data", va="center", fontsize=8, color=colours[p["label"]])
    if x == "updates":
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{s:,}" for s in xs])
        ax.set_xlabel("updates (each <= 2,048 target tokens)")
    else:
        ax.set_xlabel("training wall-clock minutes")
    ax.margins(x=0.07)
    ax.set_ylabel("test BLEU (sacreBLEU)")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=WORKDIR", help="a long run (repeatable)")
    parser.add_argument("--steps", default="600,1200,2400,4800", help="updates to measure, comma-separated")
    parser.add_argument("--average", type=int, default=3, help="checkpoints averaged (the recipes' average_last)")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.png")
    parser.add_argument("--models", type=Path, default=REPO / "benchmarks" / "out" / "learning_curve",
                        help="where the averaged models and their translations go")
    args = parser.parse_args()
    runs = [item.split("=", 1) for item in args.run]
    if any(len(run) != 2 for run in runs):
        parser.error("--run takes LABEL=WORKDIR")
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    points = json.loads(json_path.read_text(encoding="utf-8"))["points"] if json_path.exists() else []
    done = {(p["label"], p["step"]) for p in points}
    for label, workdir in runs:
        for step in (int(s) for s in args.steps.split(",")):
            if (label, step) in done or not has_step(Path(workdir), step, args.average):
                continue
            points.append(measure(label, Path(workdir), step, args.models, args.average, args.threads))
            print(json.dumps(points[-1]), flush=True)
            atomic_write_text(json_path, json.dumps({"machine": machine(), "points": points}, indent=1) + "\n")
    if points:
        plot(points, png_path)
        print(f"wrote {json_path} and {png_path}")
    if any(p.get("train_minutes") is not None for p in points):
        minutes_path = args.out.with_name(args.out.name + "-minutes.png")
        plot(points, minutes_path, x="minutes")
        print(f"wrote {minutes_path}")


if __name__ == "__main__":
    main()
