"""The GPU check: one command that turns a short GPU lease into figures and failures.

    PYTHONPATH=. python benchmarks/gpu_check.py --out OUT --device cuda --data gpu-data/quickstart
    python benchmarks/gpu_check.py --out /tmp/gpu-check --device cpu --tiny      (CI: under a minute)

Writes OUT/gpu_check.json and OUT/gpu_check.md. Each part runs in a forked process of its own
process group under its own time limit (cut to what is left of ``--budget-s``), so a failing,
crashing or hanging part is recorded (cause, traceback tail; or "timeout") and the others run.
Parts: device, invariants, training, resume, kernels, torchrun, profile, quickstart, decode, train_speed
(docs/gpu.md says what each proves). ``--tiny`` shrinks every part to tiny shapes and a few
steps; on CPU the parts that need CUDA (fused attention kernels, NCCL) are recorded as skipped
with the reason, never as passed.

The data (``--data``: a work directory of ``nmtkit prepare``, holding prepared/ and config.yaml)
is built on a machine with the SWORD Bibles and carried to the GPU machine:

    PYTHONPATH=. python -m nmtkit prepare recipes/quickstart.yaml workdir=gpu-data/quickstart

Without ``--data`` a toy task is prepared in a scratch directory (fine for ``--tiny``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import common

# Seconds per part at full size on one H100, in the default order. Together 610 s, more than the
# 480 s of --budget-s in the device command: the parts took 290 s in all on an H100, and the last
# one, train_speed, takes what is left (it saves each run as it goes).
LIMITS = {"device": 15, "invariants": 25, "training": 40, "resume": 80, "kernels": 40, "torchrun": 40,
          "profile": 30, "quickstart": 110, "decode": 60, "train_speed": 170}
TINY_LIMITS = {name: 60 for name in LIMITS}
CORRECTNESS = ("invariants", "training", "resume", "kernels", "torchrun")


def device_part(settings: dict) -> dict:
    """What the figures were measured on."""
    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": settings["device"]}
    if settings["device"].startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        out.update(name=props.name, memory_gib=round(props.total_memory / 2 ** 30, 1),
                   capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                   cudnn=torch.backends.cudnn.version())
        try:
            import subprocess

            out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out["driver"] = None
    return out


VARIANTS = {"paper": {}, "pre-norm": {"pre_norm": True}, "rope": {"positions": "rope"},
            "alibi": {"positions": "alibi"}, "rmsnorm-swiglu": {"norm": "rmsnorm", "ffn": "swiglu"},
            "moe": {"moe_experts": 4, "moe_top_k": 2}, "lstm": {"arch": "rnn", "cell": "lstm"}}


def variant_config(name: str, tiny: bool):
    from nmtkit.config import ModelConfig

    if name == "lstm":
        return ModelConfig(arch="rnn", cell="lstm", embed_dim=16 if tiny else 256, hidden_dim=24 if tiny else 512,
                           encoder_layers=2, decoder_layers=2, dropout=0.0)
    d = 32 if tiny else 256
    return ModelConfig(d_model=d, ffn_dim=2 * d if tiny else 4 * d, heads=2 if tiny else 4, encoder_layers=2,
                       decoder_layers=2, dropout=0.0, max_positions=64, **VARIANTS[name])


def invariants_part(settings: dict) -> dict:
    """Incremental = full, batched = one by one, padded = unpadded, per variant, float32 (TF32
    off) and bf16 autocast on the device: the largest logit differences."""
    import torch

    import invariants
    from nmtkit.models.build import build_model

    device, vocab = torch.device(settings["device"]), 64 if settings["tiny"] else 1000
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    tolerance = {"float32": 1e-4, "bf16": 0.25}  # logits of unit scale; bf16 keeps 8 bits of mantissa
    records, passed = [], True
    for name in VARIANTS:
        torch.manual_seed(0)
        model = build_model(variant_config(name, settings["tiny"]), vocab, vocab).eval().to(device)
        for dtype_name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            diffs = invariants.invariant_differences(model, vocab, device, dtype)
            ok = max(diffs.values()) <= tolerance[dtype_name]
            passed &= ok
            records.append({"variant": name, "dtype": dtype_name, **diffs, "ok": ok})
    return {"records": records, "tolerance": tolerance, "passed": passed}


def kernels_part(settings: dict) -> dict:
    """Which SDPA kernels the paper's model (and each variant) can run on, proven by restricting
    ``sdpa_kernel`` to each backend: training steps and a decoding pass, bf16 autocast."""
    if not settings["device"].startswith("cuda"):
        raise common.Skipped("needs CUDA (fused attention kernels)")
    import gpu_kernels

    return gpu_kernels.kernels(settings)


def set_up_as_nmtkit(function):
    """The part, run with the device set up as nmtkit's own commands set it up (``resolve_device``:
    e.g. SDPA kept off cuDNN's per-shape kernels), so the check measures what users get. Called in
    the part's forked process: the check's own process must not initialise CUDA."""
    def part(settings: dict):
        from nmtkit.runtime.device import resolve_device

        resolve_device(settings["device"])
        return function(settings)

    return part


def parts() -> dict:
    import gpu_runs
    import gpu_training

    functions = {"device": device_part, "invariants": invariants_part, "training": gpu_training.training_part,
                 "resume": gpu_runs.resume_part, "kernels": kernels_part, "torchrun": gpu_runs.torchrun_part,
                 "profile": gpu_training.profile_part, "train_speed": gpu_training.train_speed_part, "quickstart": gpu_runs.quickstart_part,
                 "decode": gpu_runs.decode_part}
    return {name: set_up_as_nmtkit(function) for name, function in functions.items()}


def status_of(name: str, outcome: dict) -> str:
    """passed / failed for correctness parts, measured for the others; or skipped / error / timeout."""
    if outcome["status"] != "ok":
        return outcome["status"]
    if name in CORRECTNESS:
        return "passed" if outcome["value"].get("passed") else "failed"
    return "measured"


class Stopped(Exception):
    """The check was told to stop from outside (``timeout``'s SIGTERM, Ctrl-C): the running part
    is ended with all it started and recorded, and what finished is kept."""


def stop_on_signals() -> None:
    """SIGTERM, SIGINT and SIGHUP raise Stopped in the check's own process. Without this, the
    ``timeout`` of the device command would end the check and leave the running part, which sits
    in a process group of its own, holding the GPU and the output pipe."""
    import signal

    def stop(number, frame):
        raise Stopped(signal.Signals(number).name)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, stop)


def run_parts(settings: dict, chosen: list[str], budget: float, written=lambda results: None,
              limits: dict | None = None) -> dict:
    """Each chosen part in turn; ``written(results)`` before each (the part recorded as running)
    and after it, so a check stopped from outside, even by SIGKILL, leaves on disk the parts it
    finished and the one it was in. Stopped (a signal) ends the running part, records it as
    ``stopped`` with what it had saved, and is raised again once that is written."""
    functions = parts()
    limits = {**(TINY_LIMITS if settings["tiny"] else LIMITS), **(limits or {})}
    results, start = {}, time.perf_counter()
    for index, name in enumerate(chosen):
        left = budget - (time.perf_counter() - start)
        if left < 5:
            results[name] = {"status": "skipped", "reason": "the check's time budget (--budget-s) was spent"}
            continue
        limit = min(limits[name], left)
        if name == "decode" and results.get("quickstart", {}).get("status") == "measured":
            settings["quickstart_model"] = results["quickstart"]["result"]["model_dir"]
        partial = Path(settings["scratch"]) / f"{name}.partial.json"  # what a part saved before it was stopped
        results[name] = {"status": "running", "limit_s": round(limit)}
        written(results)
        began = time.perf_counter()
        try:
            outcome = common.run_isolated(functions[name], {**settings, "deadline": time.time() + limit,
                                                            "partial": str(partial)}, limit)
        except Stopped as why:
            outcome = {"status": "stopped", "seconds": round(time.perf_counter() - began, 2),
                       "reason": f"the check was stopped from outside ({why}) while this part ran"}
            results.update({later: {"status": "not run", "reason": "the check was stopped before it"}
                            for later in chosen[index + 1:]})
        results[name] = record_of(name, outcome, limit, partial)
        written(results)
        print(f"gpu_check: {name}: {results[name]['status']} ({results[name]['seconds']} s)", file=sys.stderr,
              flush=True)
        if outcome["status"] == "stopped":
            raise Stopped(outcome["reason"])
    return results


def record_of(name: str, outcome: dict, limit: float, partial: Path) -> dict:
    """A part's entry in gpu_check.json: status, time, limit, cause or result; for a part that did
    not finish, the figures it had saved."""
    record = {"status": status_of(name, outcome), "seconds": outcome["seconds"], "limit_s": round(limit)}
    saved = common.read_partial(partial) if outcome["status"] in ("timeout", "crashed", "stopped") else None
    if saved is not None:
        record["partial_result"] = saved
    for key in ("reason", "cause", "traceback", "exitcode"):
        if key in outcome:
            record[key] = outcome[key]
    if "value" in outcome:
        record["result"] = outcome["value"]
    return record


def markdown(payload: dict) -> str:
    lines = ["## GPU check", "", f"Command: `{payload['command']}`", "",
             f"Machine: {payload['machine']['cpu']}; {json.dumps(payload['parts'].get('device', {}).get('result'))}",
             "", "| part | status | seconds | detail |", "|---|---|---|---|"]
    for name, record in payload["parts"].items():
        detail = record.get("reason") or record.get("cause") or summary(name, record.get("result") or {})
        lines.append(f"| {name} | {record['status']} | {record['seconds'] if 'seconds' in record else '—'} | "
                     f"{detail.replace('|', '/')} |")
    speed = (payload["parts"].get("train_speed", {}).get("result") or {}).get("records", [])
    if speed:
        lines += ["", "| training run | max_tokens | tgt tok/s | MFU % | peak GiB | status |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['run']} | {r.get('max_tokens', '—')} | {r.get('tgt_tok_s', '—')} | {r.get('mfu_pct', '—')} | "
                  f"{r.get('peak_mem_gib', '—')} | {r.get('status', r.get('cause', 'measured'))} |" for r in speed]
    decode = (payload["parts"].get("decode", {}).get("result") or {}).get("records", [])
    if decode:
        lines += ["", "| decoding | sent/s | tgt tok/s | status |", "|---|---|---|---|"]
        lines += [f"| {r['config']} | {r.get('sent_s', '—')} | {r.get('tgt_tok_s', '—')} | "
                  f"{r.get('status', r.get('cause', 'measured'))} |" for r in decode]
    return "\n".join(lines) + "\n"


def summary(name: str, result: dict) -> str:
    """One line of a part's headline figures for the Markdown table."""
    if name == "training":
        ends = ", ".join(f"{d} end {result[d]['end_rel_diff_vs_float32']:.1%} off float32, {result[d]['skipped']} skipped"
                         for d in ("bf16", "fp16") if d in result)
        return f"float32 vs CPU max rel diff {result.get('max_rel_diff_vs_cpu', 0):.2e}; {ends}"
    if name == "kernels":
        return (f"paper on fused kernels {result.get('paper_on_fused_kernels')}, unpadded training on flash "
                f"{result.get('paper_unpadded_training_on_flash')}; math fallbacks: {result.get('math_fallbacks')}")
    if name == "torchrun":
        return f"resumed launch: {result.get('resumed', {}).get('checkpoints')}"
    if name == "resume":
        det = result.get("deterministic", {})
        return f"deterministic bit-identical {det.get('bit_identical')}; default {result.get('default', {})}"
    if name == "quickstart":
        return (f"wall {result.get('wall_s')} s (training {result.get('train_minutes')} min at {result.get('train_tgt_tok_s')} "
                f"tok/s), test BLEU {result.get('test_bleu')}")
    if name == "invariants":
        worst = max((r for r in result.get("records", [])), key=lambda r: r["incremental_vs_full"], default={})
        return f"worst incremental diff {worst.get('incremental_vs_full')} ({worst.get('variant')} {worst.get('dtype')})"
    return ""


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and a few steps (the CPU mode of CI)")
    parser.add_argument("--data", help="a work directory made by `nmtkit prepare` (default: a toy task made here)")
    parser.add_argument("--parts", default=",".join(LIMITS), help="comma-separated parts (default: all)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="total time for the parts (default 480)")
    parser.add_argument("--train-runs", help="train_speed's runs by name, in order, repeats allowed (default: all)")
    parser.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS",
                        help="a part's own time limit instead of its default (repeatable)")
    args = parser.parse_args(argv)
    chosen = [p for p in args.parts.split(",") if p]
    unknown = [p for p in chosen if p not in LIMITS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r} (parts: {', '.join(LIMITS)})")
    if args.train_runs:
        from gpu_training import TRAIN_RUNS

        unknown = [r for r in args.train_runs.split(",") if r and r not in TRAIN_RUNS]
        if unknown:
            parser.error(f"unknown train_speed run {unknown[0]!r} (runs: {', '.join(TRAIN_RUNS)})")
    limits = {}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in LIMITS or not seconds.replace(".", "", 1).isdigit():
            parser.error(f"--limit wants PART=SECONDS with a known part, got {item!r}")
        limits[name] = float(seconds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    stop_on_signals()
    # The parts are forked from this process, and once it has asked CUDA anything (even
    # torch.cuda.is_available(), which counts devices through the driver) a forked part cannot
    # use CUDA at all. This process never asks; should a library it imports ask, NVML answers.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if args.tiny:  # tiny shapes gain nothing from intra-op threads and lose much on a busy machine
        import torch
        # torch.optim imports torch._dynamo with the first optimizer: seconds on a slow CPU, paid again
        # in every forked part and command that trains, most of a tiny one. Imported here, they inherit
        # it. (At full size the parts import it themselves, as the figures in RESULTS.md were measured.)
        import torch._dynamo  # noqa: F401

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)  # forked parts inherit it
    command = "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = common.machine()

    def write(results: dict) -> dict:
        """gpu_check.json and .md as they stand, each replaced whole (a kill mid-write leaves the last)."""
        from nmtkit.storage.files import atomic_write_text

        payload = {"command": command, "machine": machine, "tiny": args.tiny,
                   "wall_s": round(time.perf_counter() - started, 1), "parts": results}
        atomic_write_text(out / "gpu_check.json", json.dumps(payload, indent=2, default=str) + "\n")
        atomic_write_text(out / "gpu_check.md", markdown(payload))
        return payload

    write({})
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        settings = {"device": args.device, "tiny": args.tiny, "scratch": scratch, "data": args.data,
                    "train_runs": [r for r in (args.train_runs or "").split(",") if r]}
        import gpu_runs

        if not args.data:
            made = common.run_isolated(gpu_runs.make_tiny_data, Path(scratch) / "toy", 120)
            settings["data"] = str(made["value"]) if made["status"] == "ok" else None
            if settings["data"] is None:
                print(f"gpu_check: could not prepare the toy data: {made}", file=sys.stderr)
        return write(run_parts(settings, chosen, args.budget_s, write, limits))


if __name__ == "__main__":
    try:
        main()
    except Stopped as stopped:  # what finished is in --out already
        print(f"gpu_check: stopped: {stopped}", file=sys.stderr)
        sys.exit(1)
    except Exception:  # the check itself broke: say so in one place, with the traceback
        traceback.print_exc()
        sys.exit(1)
