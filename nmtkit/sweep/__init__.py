"""``nmtkit sweep``: many variants of one recipe, run one at a time, tabulated with significance.

    spec.py       the sweep file: base recipe, named variants, grids; every config built up front
    runner.py     each variant as a child `nmtkit run`, shared prepares, skip and resume, --dry-run
    record.py     a variant's sweep-run.json: status, config digest, peak RSS
    plan.py       sweep.json: the runs in order (written before any run, read by `nmtkit plot`)
    results.py    results.json / results.md: scores, speed, size, memory, p-values against the baseline
    spread.py     over seeds and splits: each variant's spread and its paired tests against the baseline
"""
