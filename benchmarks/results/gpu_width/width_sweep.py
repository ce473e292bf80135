"""Where bf16 starts to pay for translation on a GPU: random-weight Transformers of widths 256-1024
(6+6 layers, FFN 4d, heads d/64) and vocabularies of 8k and 32k pieces, decoded at forced lengths
(28 pieces, 500 WMT-like source lengths, gpu_runs.forced_search: translate's search on ids) with
the weights in bf16 and in float32, beam 4 and greedy, two rounds with the dtype order swapped.
Run from the repository root: PYTHONPATH=.:benchmarks python3 benchmarks/results/gpu_width/width_sweep.py OUT.json"""
import dataclasses
import json
import sys
import time

import torch

import common
import gpu_runs
import gpu_training
from nmtkit.models.build import build_model
from nmtkit.runtime.device import resolve_device

# resolve_device sets the device up as translate does (on CUDA: SDPA kept off cuDNN's attention,
# which sets up every new shape once; the first run of this script skipped it, see RESULTS.md)
out, device = sys.argv[1], resolve_device("cuda" if torch.cuda.is_available() else "cpu")
small = device.type == "cpu"  # a smoke run here: two widths, 16 sentences
base, _, _ = gpu_training.wmt_model("base", False)
n, forced = (16, 6) if small else (500, 28)
src_lens, _ = gpu_training.wmt_lengths(n, seed=3, limit=200)
records = []
for vocab in ((8000,) if small else (8000, 32000)):
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(4, vocab, (int(length),), generator=g) for length in src_lens]
    for d in ((64, 128) if small else (256, 384, 512, 768, 1024)):
        cfg = dataclasses.replace(base, d_model=d, ffn_dim=4 * d, heads=max(1, d // 64))
        torch.manual_seed(0)
        model = build_model(cfg, vocab, vocab).eval().to(device)
        for rnd in (1, 2):
            order = (("bf16", torch.bfloat16), ("float32", torch.float32))
            for name, dtype in (order if rnd == 1 else order[::-1]):
                model = model.to(dtype)
                for beam in (4, 1):
                    gpu_runs.forced_search(model, rows[:8], device, beam, forced)  # warm-up
                    common.synchronize(device)
                    start = time.perf_counter()
                    tokens = gpu_runs.forced_search(model, rows, device, beam, forced)
                    common.synchronize(device)
                    seconds = time.perf_counter() - start
                    records.append({"vocab": vocab, "d_model": d, "round": rnd, "dtype": name, "beam": beam,
                                    "sent_s": round(n / seconds, 1), "tokens": tokens})
                    print(json.dumps(records[-1]), flush=True)
                    with open(out, "w") as f:
                        json.dump({"cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(), "device": torch.cuda.get_device_name() if not small else "cpu",
                                   "torch": torch.__version__, "records": records}, f, indent=1)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
