"""translate's bound on a constrained search (``decoding/cost.py``): a line whose search alone
would pass it is a one-line error naming it, before any search runs, and constrained lines
that fit are searched in calls kept under it, with the outputs of one big batch."""
from __future__ import annotations

import json
import resource

from nmtkit.decoding import cost
from nmtkit.decoding.cost import split_by_cost
from nmtkit.decoding.guides import Guide, target_ids
from support.cli import cli_in_process
from support.guided import FAST, LINES, guided, loaded, trained  # noqa: F401  (module fixtures)


def test_calls_are_cut_to_the_bound_widest_first_and_keep_every_line():
    pieces = {0: 10, 1: 300, 2: 0, 3: 300, 4: 50, 5: 299}

    def bytes_of(group):  # grows with the lines and the widest of them, as the estimate does
        return len(group) * max(pieces[i] for i in group) ** 2

    limit = bytes_of([1, 3])
    calls = split_by_cost(list(pieces), bytes_of, pieces.__getitem__, limit=limit)
    assert sorted(i for call in calls for i in call) == list(pieces)
    assert all(bytes_of(call) <= limit for call in calls)
    assert calls[0] == [1, 3]  # widest first, as many as fit
    assert split_by_cost([0, 1], bytes_of, pieces.__getitem__, limit=1) == [[1], [0]]  # alone past it: its own


def test_constrained_lines_split_by_cost_translate_as_one_batch(loaded, monkeypatch):  # noqa: F811
    from nmtkit.decoding.options import TranslateOptions
    from nmtkit.decoding.torch_engine import TorchEngine
    from nmtkit.decoding.translate import Translator

    sets = [["j"], ["b c"], [], ["a", "h i"], ["e f g"], ["d", "d"], ["i"], ["c", "j a"]]
    guides = [Guide(constraints=tuple(s)) for s in sets]
    together = guided(loaded, guides, beam_size=3)
    options = TranslateOptions(**{**FAST, "beam_size": 3})
    translator = Translator(TorchEngine.from_loaded(loaded, options), options)
    sources = translator.encode(LINES)
    pieces = {i: sum(map(len, phrases)) for i, phrases in enumerate(target_ids(translator.tgt_vocab, guides)[1])}
    widest = max(translator.search_cost([i], sources, pieces) for i in pieces if pieces[i])
    monkeypatch.setattr(cost, "MAX_SEARCH_BYTES", widest)  # every line fits alone, not many together
    sizes, search = [], TorchEngine.search
    monkeypatch.setattr(TorchEngine, "search", lambda self, src, *a, **k: sizes.append(len(src)) or
                        search(self, src, *a, **k))
    assert guided(loaded, guides, beam_size=3) == together
    assert len(sizes) >= 3 and max(sizes) < len(LINES)  # one call of eight without the bound


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
