"""The search cost estimate: an upper bound of the memory a search really takes (measured in
a fresh process), not a uselessly loose one, and growing as the search's tensors do."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmtkit.decoding.cost import estimate_search_bytes

# each case: (sentences, source pieces, constraint pieces, beam, vocab, output pieces, alignments)
MEASURE = r'''
import ctypes, json, random, re, sys
import torch
from nmtkit.config import ModelConfig
from nmtkit.models.build import build_model
from nmtkit.decoding.search import beam_search
torch.set_num_threads(1)


def resident(field):
    with open("/proc/self/status") as status:
        return int(re.search(field + r":\s+(\d+) kB", status.read()).group(1)) * 1024


cfg = ModelConfig(d_model=32, ffn_dim=64, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=512)
peaks = []
for n, S, W, k, V, L, attn in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    net = build_model(cfg, V, V).eval()
    src, mask = torch.randint(4, V, (n, S)), torch.ones(n, S, dtype=torch.bool)
    rng = random.Random(0)
    cons = [[[rng.randrange(4, V) for _ in range(W // 4)] for _ in range(4)] for _ in range(n)] if W else None
    beam_search(net, src[:, :2], mask[:, :2], 2, max_len_a=0, max_len_b=2)  # warm up
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # memory freed by earlier cases leaves the process
    except (OSError, AttributeError):  # not glibc: each case then measures what the earlier left free
        pass
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak resident size (VmHWM) restarts from the current one
    before = resident("VmRSS")
    beam_search(net, src, mask, k, max_len_a=0, max_len_b=L, min_len=L, need_attn=bool(attn), constraints=cons)
    peaks.append(resident("VmHWM") - before)
print(json.dumps(peaks))
'''


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS")
def test_estimate_bounds_the_measured_peak_within_a_factor_of_three():
    cases = [(48, 20, 0, 8, 3000, 30, 1), (2, 8, 300, 8, 40, 12, 0), (128, 20, 0, 4, 16000, 30, 0)]
    done = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(cases)], capture_output=True, check=True)
    measured = json.loads(done.stdout)
    state = 2 * 4 * 32 * 1  # keys and values of one d-32 decoder layer, float32
    for (n, source, pieces, beam, vocab, output, attn), peak in zip(cases, measured):
        estimate = estimate_search_bytes(n, source, output, beam, vocab, pieces, bool(attn), state)
        assert peak > 10 << 20, measured  # the search, not noise, dominates what was measured
        assert peak <= estimate <= 3 * peak, (n, pieces, peak, estimate)


def test_estimate_grows_with_the_square_of_constraint_pieces_and_linearly_in_beam():
    def constrained(pieces: int, beam: int = 8) -> int:
        return estimate_search_bytes(1, 10, 20, beam, 100, pieces) - estimate_search_bytes(1, 10, 20, beam, 100, 0)

    assert constrained(2000) > 3.9 * constrained(1000)
    assert constrained(1000, beam=16) == 2 * constrained(1000, beam=8)
    plain = estimate_search_bytes(4, 10, 20, 4, 100)
    assert estimate_search_bytes(8, 10, 20, 4, 100) == 2 * plain  # sentences x beam are the rows
    assert estimate_search_bytes(4, 10, 20, 4, 100, alignments=True) > plain


def test_one_text_inside_every_count_limit_can_need_tens_of_gigabytes():
    """32 phrases of 60 three-piece words under beam 16: what a server's count limits admit."""
    from nmtkit.serving.admission import format_bytes
    from nmtkit.serving.requests import Limits

    needed = estimate_search_bytes(1, 600, 650, 16, 32000, 32 * 60 * 3)
    assert needed > 7 * Limits().max_search_bytes and format_bytes(needed).endswith(" GiB")
    assert format_bytes(512) == "512 bytes" and format_bytes(3 << 29) == "1.5 GiB"
