"""The constrained search's memory is estimated before it runs: a line whose constraints
would need more than the bound is a one-line error naming it, and lines that fit are searched
in batches the bound allows, with the outputs of one big batch."""
from __future__ import annotations

import json
import resource
import subprocess
import sys


from conftest import cli_in_process
from nmtkit.decoding import cost
from nmtkit.decoding.cost import estimate_search_bytes, split_by_cost
from nmtkit.decoding.guides import Guide
from test_guided_decoding import LINES, guided, loaded, trained  # noqa: F401  (module fixtures)

MEASURE = """
import resource, sys, torch
from nmtkit.decoding.constraints import LexicalConstraints
pieces, beam, vocab = int(sys.argv[1]), int(sys.argv[2]), 50
lexical = LexicalConstraints([[[4 + i % 40 for i in range(pieces)]]], beam, "cpu")
lprobs = torch.randn(beam, vocab).log_softmax(-1)
top, flat = lprobs.view(-1).topk(2 * beam)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lexical.expand(torch.zeros(1, beam), lprobs, top[None], (flat // vocab)[None], (flat % vocab)[None], torch.arange(1))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_the_estimate_covers_what_the_constrained_step_allocates():
    pieces, beam = 1500, 4
    measured = int(subprocess.run([sys.executable, "-c", MEASURE, str(pieces), str(beam)], capture_output=True,
                                  text=True, check=True, env={"OMP_NUM_THREADS": "1", "PATH": ""}).stdout)
    estimate = estimate_search_bytes(1, beam, pieces)
    assert estimate == beam * (3 + pieces) * pieces * cost.CELL_BYTES
    assert measured <= estimate <= 3 * measured
    assert estimate_search_bytes(3, beam, pieces) == 3 * estimate  # linear in the sentences
    assert estimate_search_bytes(1, beam, 0, vocab_size=100) == beam * 100 * cost.LOGIT_BYTES


def test_batches_are_cut_to_the_bound_and_keep_every_line():
    pieces = {0: 10, 1: 300, 2: 0, 3: 300, 4: 50, 5: 299}
    limit = estimate_search_bytes(2, 4, 300)
    batches = split_by_cost(list(pieces), pieces, 4, limit=limit)
    assert sorted(i for batch in batches for i in batch) == list(pieces)
    assert all(estimate_search_bytes(len(b), 4, max(pieces[i] for i in b)) <= limit for b in batches)
    assert batches[0] == [1, 3]  # widest first, as many as fit
    assert split_by_cost([0, 1], pieces, 4, limit=1) == [[1], [0]]


def test_constrained_lines_split_by_cost_translate_as_one_batch(loaded, monkeypatch):  # noqa: F811
    sets = [["j"], ["b c"], [], ["a", "h i"], ["e f g"], ["d", "d"], ["i"], ["c", "j a"]]
    guides = [Guide(constraints=tuple(s)) for s in sets]
    together = guided(loaded, guides, beam_size=3)
    monkeypatch.setattr(cost, "MAX_SEARCH_BYTES", estimate_search_bytes(1, 3, 12))  # a few constrained lines a batch
    from nmtkit.decoding.torch_engine import TorchEngine

    sizes, search = [], TorchEngine.search
    monkeypatch.setattr(TorchEngine, "search", lambda self, src, *a, **k: sizes.append(len(src)) or
                        search(self, src, *a, **k))
    assert guided(loaded, guides, beam_size=3) == together
    assert len(sizes) >= 2 and max(sizes) < len(LINES)  # one batch of eight without the bound


def test_constraints_past_the_bound_are_one_line_before_any_search(trained, tmp_path, monkeypatch, capsys):  # noqa: F811
    source = tmp_path / "in.txt"
    source.write_text("a b c\n", encoding="utf-8")
    phrases = [" ".join("abcdefghij"[(i + k) % 10] for k in range(1000)) for i in range(32)]
    constraints = tmp_path / "c.jsonl"
    constraints.write_text(json.dumps(phrases) + "\n", encoding="utf-8")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, out, err = cli_in_process(monkeypatch, capsys, "translate", "-m", str(trained), "-i", str(source),
                                    "-o", str(tmp_path / "out.txt"), "--constraints", str(constraints),
                                    "--beam-size", "16", "--device", "cpu")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "line 1 has constraints of" in err and "past the limit of 4.3 GB per search" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20  # KiB: under 1 GiB more
    assert not (tmp_path / "out.txt").exists()
