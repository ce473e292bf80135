"""Study 1 of issue 16 beside the paper: each row of `nmtkit sweep recipes/sweeps/table3-mini.yaml`
next to the row of "Attention Is All You Need", Table 3, that changes the same setting the same way.

Reads one or more results.json files of the sweep, one per sitting (a machine and a day; a
sitting's work directories may be gone, so earlier ones are committed as
recipes/sweeps/table3-mini.sitting*.json), and prints a markdown table: the paper's setting and its
dev BLEU (newstest2013, tokenized) with the change against its base row, then ours (final dev loss,
dev BLEU on the held-out Bible verses and its change against the same sitting's base, test BLEU,
the paired-bootstrap p of test BLEU against that base, parameters). A row comes from the latest
sitting that finished it; each sitting that contributes rows shows its own base. Rows no sitting
finished print as pending.

    python benchmarks/table3_mini.py recipes/sweeps/table3-mini.sitting1.json data/sweeps/table3-mini/results.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the paper's Table 3: row -> (setting, dev perplexity, dev BLEU, parameters in millions); base 4.92 / 25.8 / 65
PAPER_BASE = ("N 6, d 512, FFN 2048, 8 heads of 64, dropout 0.1, smoothing 0.1", 4.92, 25.8, 65)
PAPER = {
    "A1": ("1 head of 512", 5.29, 24.9, 65), "A4": ("4 heads of 128", 5.00, 25.5, 65),
    "A16": ("16 heads of 32", 4.91, 25.8, 65), "A32": ("32 heads of 16", 5.01, 25.4, 65),
    "B16": ("d_k 16", 5.16, 25.1, 58), "B32": ("d_k 32", 5.01, 25.4, 60),
    "N2": ("2 layers", 6.11, 23.7, 36), "N4": ("4 layers", 5.19, 25.3, 50), "N8": ("8 layers", 4.88, 25.5, 80),
    "d256": ("d 256, heads of 32", 5.75, 24.5, 28), "d1024": ("d 1024, heads of 128", 4.66, 26.0, 168),
    "ff1024": ("FFN 1024", 5.12, 25.4, 53), "ff4096": ("FFN 4096", 4.75, 26.2, 90),
    "drop0": ("dropout 0", 5.77, 24.6, 65), "drop.2": ("dropout 0.2", 4.95, 25.5, 65),
    "ls0": ("smoothing 0", 4.67, 25.3, 65), "ls.2": ("smoothing 0.2", 5.47, 25.7, 65),
    "E": ("learned positions", 4.92, 25.7, 65),
}
# our variant -> (row letter, our setting in words, the paper's row that moves the same way, if any)
OURS = [
    ("base", "base", "d 256, FFN 1024, 3+3 layers, 4 heads of 64, post-norm, sinusoidal", None),
    ("A-heads,heads=1", "A", "1 head of 256", "A1"),
    ("A-heads,heads=2", "A", "2 heads of 128", "A4"),
    ("A-heads,heads=8", "A", "8 heads of 32", "A16"),
    ("A-heads,heads=16", "A", "16 heads of 16", "A32"),
    ("B-key-dim,key_dim=16", "B", "d_k 16", "B16"),
    ("B-key-dim,key_dim=32", "B", "d_k 32", "B32"),
    ("C-layers-2", "C", "2+2 layers", "N4"),
    ("C-layers-4", "C", "4+4 layers", "N8"),
    ("C-layers-6", "C", "6+6 layers", None),
    ("C-d128", "C", "d 128, FFN 512, 2 heads of 64", "d256"),
    ("C-d512", "C", "d 512, FFN 2048, 8 heads of 64", "d1024"),
    ("C-ffn,ffn_dim=512", "C", "FFN 512", "ff1024"),
    ("C-ffn,ffn_dim=2048", "C", "FFN 2048", "ff4096"),
    ("D-dropout,dropout=0.0", "D", "dropout 0", "drop0"),
    ("D-dropout,dropout=0.2", "D", "dropout 0.2", "drop.2"),
    ("D-label-smoothing,label_smoothing=0.0", "D", "smoothing 0", "ls0"),
    ("D-label-smoothing,label_smoothing=0.2", "D", "smoothing 0.2", "ls.2"),
    ("E-learned-positions", "E", "learned positions", "E"),
    ("pre-norm", "notes", "pre-norm", None),
    ("rmsnorm", "notes", "pre-norm, RMSNorm", None),
    ("gelu", "notes", "GELU FFN", None),
    ("swiglu", "notes", "SwiGLU FFN", None),
    ("alibi", "notes", "ALiBi positions", None),
    ("rope", "notes", "rotary positions", None),
    ("moe-4x-top2", "notes", "MoE: 4 experts, top-2, every 2nd FFN", None),
]


def signed(x: float) -> str:
    return f"{x:+.1f}".replace("-", "−")


def paper_cells(row: str | None) -> list[str]:
    if row is None:
        return ["—", "—"]
    setting, _, bleu, params = PAPER[row]
    return [setting, f"{bleu} ({signed(bleu - PAPER_BASE[2])}), {params}M"]


def our_cells(result: dict | None, base: dict | None) -> list[str]:
    if not result or result.get("status") != "done":
        params = f"{result['parameters'] / 1e6:.1f}M" if result else "—"
        return ["pending", "—", "—", "—", params]
    delta = f" ({signed(result['dev_bleu'] - base['dev_bleu'])})" if base and result is not base else ""
    p = result.get("p_value")
    return [f"{result['dev_loss']:.3f}", f"{result['dev_bleu']:.2f}{delta}", f"{result['test_bleu']:.2f}",
            "—" if p is None else f"{p:.3f}", f"{result['parameters'] / 1e6:.1f}M"]


def done(results: dict) -> dict[str, dict]:
    return {v["name"]: v for v in results["variants"] if v.get("status") == "done"}


def table(sittings: list[dict]) -> str:
    """One line per row of OURS from the latest sitting that finished it (index from 1 in the
    sitting column); the base once for every sitting that contributes a row (pending where that
    sitting did not finish its base)."""
    finished = [done(results) for results in sittings]
    known = {name for name, *_ in OURS}
    unknown = sorted({name for results in sittings for name in (v["name"] for v in results["variants"])} - known)
    if unknown:
        sys.exit(f"variants this table does not place: {', '.join(unknown)}")
    source = {name: max((i for i, rows in enumerate(finished) if name in rows), default=None) for name in known}
    contributing = sorted({i for i in source.values() if i is not None})
    lines = ["| row | sitting | nmtkit setting | dev loss | dev BLEU (Δ base) | test BLEU | p | params "
             "| paper's setting | paper dev BLEU (Δ base), params |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    latest_params = {v["name"]: v for v in sittings[-1]["variants"]}
    for name, letter, words, row in OURS:
        paper = [PAPER_BASE[0], f"{PAPER_BASE[2]}, {PAPER_BASE[3]}M"] if name == "base" else paper_cells(row)
        shown = (contributing or [None]) if name == "base" else [source[name]]
        for i in shown:
            result = finished[i].get(name) if i is not None else latest_params.get(name)
            base = finished[i].get("base") if i is not None else None
            sitting = "—" if i is None else str(i + 1)
            lines.append("| " + " | ".join([letter, sitting, words, *our_cells(result, base), *paper]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="the sweep's results.json of each sitting, oldest first")
    args = parser.parse_args()
    print(table([json.loads(path.read_text(encoding="utf-8")) for path in args.results]))


if __name__ == "__main__":
    main()
