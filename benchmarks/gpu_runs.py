"""The parts of gpu_check.py that run nmtkit's own commands on prepared data: kill-and-resume,
the quickstart end to end, decoding speed, one-process torchrun with NCCL; and the tiny prepared
directory the CPU mode uses when no ``--data`` is given.

Commands run in forked processes calling ``nmtkit.cli.main`` (the code path of the command line,
without a fresh interpreter's seconds of imports); each part's process group is stopped by
gpu_check.py when the part overruns.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import common
from nmtkit.runlog import read_metrics

TINY_MODEL = {"arch": "transformer", "d_model": 32, "ffn_dim": 64, "heads": 2, "encoder_layers": 1,
              "decoder_layers": 1, "dropout": 0.0, "positions": "sinusoidal", "pre_norm": False}


def nmtkit_command(argv: list[str], deterministic: bool = False) -> None:
    """Run ``nmtkit ARGV`` in this (forked) process, as the command line would; with
    ``deterministic``, torch's deterministic algorithms first (cuBLAS needs its workspace set)."""
    import torch

    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
    from nmtkit import cli

    sys.argv = ["nmtkit", "-q", *argv]
    cli.main()


def forked(argv: list[str], deterministic: bool = False):
    import multiprocessing

    process = multiprocessing.get_context("fork").Process(target=nmtkit_command, args=(argv, deterministic))
    process.start()
    return process


def run_nmtkit(argv: list[str], deterministic: bool = False) -> float:
    """``nmtkit ARGV`` to the end in a forked process; its wall time. A non-zero exit raises."""
    start = time.perf_counter()
    process = forked(argv, deterministic)
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"nmtkit {' '.join(argv)} exited with {process.exitcode}")
    return time.perf_counter() - start


def make_tiny_data(out: Path) -> Path:
    """A work directory holding a prepared/ of a toy task (600 pairs) and its config.yaml, made by
    ``nmtkit prepare``: the data of the CPU mode when no ``--data`` is given."""
    rng = random.Random(0)
    words = "the a cat dog sat ran on under mat house big small red blue and quickly".split()
    files = {}
    for split, n in (("train", 600), ("dev", 20), ("test", 20)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]
        (out / "text").mkdir(parents=True, exist_ok=True)
        for lang, text in (("src", lines), ("tgt", [" ".join(reversed(s.split())) for s in lines])):
            path = out / "text" / f"{split}.{lang}"
            path.write_text("".join(line + "\n" for line in text), encoding="utf-8")
            files.setdefault(split, {})[lang] = str(path)
    recipe = {"name": "tiny", "workdir": str(out / "work"), "data": {"source": "files", "src_lang": "src",
              "tgt_lang": "tgt", "files": files}, "vocab": {"size": 32, "workers": 1}}
    (out / "tiny.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    run_nmtkit(["prepare", str(out / "tiny.yaml")])
    return out / "work"


def work_recipe(data: Path, scratch: Path, settings: dict, **train) -> Path:
    """The data's own resolved recipe (DATA/config.yaml) in a scratch work directory whose
    prepared/ links to DATA/prepared; the tiny model in the CPU mode; ``train`` overrides."""
    cfg = yaml.safe_load((data / "config.yaml").read_text(encoding="utf-8"))
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "prepared").symlink_to((data / "prepared").resolve())
    cfg["workdir"] = str(scratch)
    if settings["tiny"]:
        cfg["model"] = {**cfg["model"], **TINY_MODEL}
        cfg["decode"] = {**cfg.get("decode", {}), "max_len_b": 12}
        train = {"threads": 1, **train}
    cfg["train"] = {**cfg["train"], "device": settings["device"], "tensorboard": False, "max_minutes": 0,
                    "max_epochs": 0, "patience": 0, **train}
    path = scratch / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def final_tensors(run_dir: Path) -> dict:
    """Every tensor of the newest checkpoint: weights and trainer state (moments, EMA)."""
    from safetensors.torch import load_file

    newest = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return {f"{name}:{key}": value for name in ("model.safetensors", "trainer.safetensors")
            for key, value in load_file(str(newest / name)).items()}


def compare(a: dict, b: dict) -> dict:
    if a.keys() != b.keys():
        return {"bit_identical": False, "max_abs_diff": None, "note": "different tensor names"}
    diffs = [float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a]
    return {"bit_identical": all(a[k].dtype == b[k].dtype and bool((a[k] == b[k]).all()) for k in a),
            "max_abs_diff": max(diffs), "tensors": len(a)}


def killed_and_resumed(recipe: Path, run_dir: Path, kill_after: int, deterministic: bool) -> None:
    """Train, SIGKILL the process once checkpoint ``kill_after`` is written, train again (resume)."""
    marker = run_dir / "checkpoints" / f"step_{kill_after:08d}" / "checksums.json"
    process = forked(["train", str(recipe)], deterministic)
    while process.is_alive() and not marker.exists():
        time.sleep(0.01)
    killed = process.is_alive()
    if killed:
        os.kill(process.pid, signal.SIGKILL)
    process.join()
    run_nmtkit(["train", str(recipe)], deterministic)
    return killed


def resume_part(settings: dict) -> dict:
    """An uninterrupted run against one killed after its first checkpoint and resumed: with
    deterministic algorithms (bit-identical expected) and, on CUDA, without (a bound)."""
    # on a GPU 40 updates: after the checkpoint of update 10 the kill has 30 more to land in
    data, steps, every = Path(settings["data"]), (4 if settings["tiny"] else 40), (2 if settings["tiny"] else 10)
    modes = [True, False] if settings["device"].startswith("cuda") else [True]
    out = {"steps": steps, "killed_after": every}
    with tempfile.TemporaryDirectory(prefix="gpu-check-resume-") as tmp:
        for deterministic in modes:
            name = "deterministic" if deterministic else "default"
            train = {"max_steps": steps, "save_every": every, "keep_last": 2, "validate_every": steps,
                     "log_every": every, "best_metric": "loss", "dtype": "float32" if settings["tiny"] else "bf16",
                     "average_last": 1}
            ref = work_recipe(data, Path(tmp) / f"{name}-ref", settings, **train)
            run_nmtkit(["train", str(ref)], deterministic)
            again = work_recipe(data, Path(tmp) / f"{name}-killed", settings, **train)
            killed = killed_and_resumed(again, Path(tmp) / f"{name}-killed" / "train", every, deterministic)
            out[name] = {"killed": killed, **compare(final_tensors(Path(tmp) / f"{name}-ref" / "train"),
                                                     final_tensors(Path(tmp) / f"{name}-killed" / "train"))}
    out["passed"] = bool(out["deterministic"]["bit_identical"] and out["deterministic"]["killed"])
    out["criteria"] = "with deterministic algorithms the resumed run's weights and optimizer state equal the " \
                      "uninterrupted run's bit for bit; without them only the bound is reported"
    return out


def carried_prepare(cfg, console) -> None:
    """Stands in for ``prepare`` in the quickstart part: the prepared data travelled with the
    tree (its SWORD source is not on the GPU machine); train and translate verify its checksums."""
    console.info("prepare: using the carried prepared directory (not timed)")


def quickstart_command(recipe: Path) -> None:
    from nmtkit.data import prepare as prepare_module

    prepare_module.prepare = carried_prepare
    nmtkit_command(["run", str(recipe)])


def quickstart_part(settings: dict) -> dict:
    """``nmtkit run`` of the data's recipe (the quickstart with --data gpu-data/quickstart): train,
    average, translate dev and test, score; wall time and test BLEU."""
    import multiprocessing

    data = Path(settings["data"])
    scratch = Path(settings["scratch"]) / "quickstart"
    overrides = {"max_steps": 4, "save_every": 2, "validate_every": 4, "log_every": 2} if settings["tiny"] else {}
    recipe = work_recipe(data, scratch, settings, **overrides)
    start = time.perf_counter()
    process = multiprocessing.get_context("fork").Process(target=quickstart_command, args=(recipe,))
    process.start()
    process.join()
    wall = time.perf_counter() - start
    if process.exitcode != 0:
        raise RuntimeError(f"nmtkit run {recipe} exited with {process.exitcode}")
    results = json.loads((scratch / "results" / "results.json").read_text(encoding="utf-8"))
    test = results["splits"]["test"]
    last = next((entry for entry in reversed(read_metrics(scratch / "train")) if entry.get("type") == "train"), {})
    return {"wall_s": round(wall, 1), "test_bleu": test["bleu"]["score"], "test_translate_s": test["translate_seconds"],
            "train_minutes": results.get("train_minutes"), "train_tgt_tok_s": last.get("tgt_tok_s"),
            "dev_translate_s": results["splits"]["dev"]["translate_seconds"],
            "dev_bleu": results["splits"]["dev"]["bleu"]["score"], "model_dir": results["model_dir"],
            "steps": yaml.safe_load(recipe.read_text(encoding="utf-8"))["train"]["max_steps"],
            "note": "prepare not timed (data carried); compare train + translate with the CPU figure"}


def decode_part(settings: dict) -> dict:
    """Beam 4 and greedy, float32 and bf16, on the quickstart test set with the model the
    quickstart part trained (decode_speed.py's measurement), bf16 beam 4 again at larger batch
    budgets, CTranslate2 on the same export when it imports; then transformer-base with random
    weights at forced lengths (synthetic ids)."""
    import decode_speed

    records = []
    model = settings.get("quickstart_model")
    if model:
        quickstart_decoding(settings, model, decode_speed, records)
    else:
        add_record(settings, records, {"config": "quickstart test set",
                                       "status": "skipped: the quickstart part made no model"})
    forced_base_decoding(settings, records)
    return {"records": records}


def add_record(settings: dict, records: list, record: dict) -> None:
    """Keep ``record``, and save all so far where gpu_check.py finds them if the part is stopped."""
    records.append(record)
    common.save_partial(settings["partial"], {"records": records})


def time_is_up(settings: dict, margin: float) -> bool:
    return time.time() > settings["deadline"] - margin


BATCH_TOKENS = 8000  # the quickstart recipe's decode.batch_tokens
LARGER_BUDGETS = (32000, 128000)


def quickstart_decoding(settings: dict, model: str, decode_speed, records: list) -> None:
    meta = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    source = Path(settings["data"]) / "prepared" / f"test.{meta['src_lang']}"
    tiny, scratch = settings["tiny"], Path(settings["scratch"])
    configs = [("torch", dtype, beam, BATCH_TOKENS) for dtype in ("bf16", "float32") for beam in (4, 1)]
    ct2_dir, ct2_failed = None, "ctranslate2 does not import"
    if decode_speed.available("ct2"):
        try:  # a failed export costs the CTranslate2 rows, not the part
            ct2_dir = decode_speed.export_for_ct2(model, scratch)
        except Exception as err:
            ct2_failed = f"export failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
        else:
            configs += [("ct2direct", "fp16" if settings["device"].startswith("cuda") else "float32", beam, BATCH_TOKENS)
                        for beam in (4, 1)]
    # last, so a slow lease loses these first: GPU decoding seemed launch-bound at 8,000 (RESULTS.md,
    # sixth lease, not profiled); does a larger budget lift it, with the same translations?
    configs += [("torch", "bf16", 4, budget) for budget in LARGER_BUDGETS]
    for engine, dtype, beam, budget in configs:
        name = f"quickstart {engine} {dtype} beam {beam}" + (f" batch_tokens {budget}" if budget != BATCH_TOKENS else "")
        if time_is_up(settings, 25):  # leave time for the forced runs
            add_record(settings, records, {"config": name, "status": "not reached: the part's time limit"})
            continue
        cfg = {"engine": engine, "dtype": dtype, "beam": beam, "forced_len": None, "model": model,
               "ct2_model": str(ct2_dir) if ct2_dir else None, "input": str(source),
               "output": str(scratch / f"{engine}-{dtype}-{beam}-{budget}.txt"), "max_sentences": 16 if tiny else 0,
               "warmup": 4 if tiny else 50, "batch_tokens": budget, "threads": 1, "device": settings["device"]}
        try:
            record = {"config": name, **decode_speed.measure(cfg)}
            if budget != BATCH_TOKENS:  # batching must not change a translation (float32 and bf16 alike)
                usual = scratch / f"{engine}-{dtype}-{beam}-{BATCH_TOKENS}.txt"
                record["same_as_8000"] = usual.exists() and usual.read_bytes() == Path(cfg["output"]).read_bytes()
            add_record(settings, records, record)
        except Exception as err:
            add_record(settings, records, {"config": name, "status": "error",
                                           "cause": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"})
    if not ct2_dir:
        add_record(settings, records, {"config": "quickstart ctranslate2",
                                       "status": f"skipped: {ct2_failed}"})


def forced_base_decoding(settings: dict, records: list) -> None:
    """transformer-base of the WMT recipe, random weights, every hypothesis exactly L pieces:
    the same work whatever the weights (decode_speed.py's forced runs, on ids)."""
    import torch

    import gpu_training
    from nmtkit.models.build import build_model

    device, tiny = torch.device(settings["device"]), settings["tiny"]
    cfg, vocab, _ = gpu_training.wmt_model("base", tiny)
    n, forced = (12, 5) if tiny else (500, 28)
    src_lens, _ = gpu_training.wmt_lengths(n, seed=3, limit=200)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(4, vocab, (int(length),), generator=g) for length in src_lens]
    torch.manual_seed(0)
    model = build_model(cfg, vocab, vocab).eval().to(device)
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("float32", torch.float32)):
        model = model.to(dtype)
        for beam in (4, 1):
            name = f"base forced {dtype_name} beam {beam}"
            if time_is_up(settings, 3):
                add_record(settings, records, {"config": name, "status": "not reached: the part's time limit"})
                continue
            forced_search(model, rows[:8], device, beam, forced)  # warm-up: kernels chosen, caches grown
            common.synchronize(device)
            start = time.perf_counter()
            tokens = forced_search(model, rows, device, beam, forced)
            seconds = time.perf_counter() - start
            add_record(settings, records, {"config": name, "sentences": n, "tgt_tokens": tokens, "forced_len": forced,
                                           "sent_s": round(n / seconds, 2), "tgt_tok_s": round(tokens / seconds, 1),
                                           "decode_s": round(seconds, 3)})


def forced_search(model, rows: list, device, beam: int, forced: int) -> int:
    """Search ``rows`` (id tensors) in length-sorted batches of 8000 source tokens x beam, every
    hypothesis exactly ``forced`` pieces; the output pieces of the best hypotheses."""
    import torch

    from nmtkit.decoding.batching import token_batches
    from nmtkit.decoding.options import SearchSettings
    from nmtkit.decoding.search import beam_search, greedy_search
    from nmtkit.specials import PAD

    settings = SearchSettings(beam_size=beam, min_len=forced, max_len_a=0.0, max_len_b=forced)
    tokens = 0
    with torch.inference_mode():
        for batch in token_batches([len(r) for r in rows], 8000, beam):
            src = torch.full((len(batch), max(len(rows[i]) for i in batch)), PAD)  # (B, S)
            for j, i in enumerate(batch):
                src[j, :len(rows[i])] = rows[i]
            src = src.to(device)
            hyps = (beam_search(model, src, src.ne(PAD), settings) if beam > 1
                    else greedy_search(model, src, src.ne(PAD), settings))
            tokens += sum(len(h[0].tokens) for h in hyps)
    return tokens


def torchrun_part(settings: dict) -> dict:
    """``torchrun --nproc_per_node 1`` with an NCCL process group: trains a few updates, saves,
    then a second launch resumes to more updates."""
    if not settings["device"].startswith("cuda"):
        raise common.Skipped("needs CUDA (NCCL)")
    return torchrun_launches(settings)


def torchrun_launches(settings: dict) -> dict:
    """The two launches of the torchrun part (gloo on a CPU). Each launch is given what is left
    of the part's time, less a margin, so an overrunning one is recorded here with the launch
    before it; its worker dies with it (gpu_ddp.py's die_with_parent)."""
    data = Path(settings["data"])
    scratch = Path(settings["scratch"]) / "torchrun"
    recipe = work_recipe(data, scratch, settings, max_steps=4, save_every=2, validate_every=4, log_every=2,
                         keep_last=3, dtype="bf16")
    launcher = str(Path(__file__).resolve().parent / "gpu_ddp.py")
    out = {}
    for launch, steps in (("first", 4), ("resumed", 8)):
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", launcher,
                str(recipe), f"train.max_steps={steps}"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=common.REPO, env=common.child_env(None),
                                  timeout=max(1.0, settings["deadline"] - time.time() - 3))
            returncode, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as late:  # its output so far: bytes, even with text=True
            returncode, stderr = None, late.stderr or b""
            stderr = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
        saved = sorted(p.name for p in (scratch / "train" / "checkpoints").glob("step_*"))
        out[launch] = {"returncode": returncode, "checkpoints": saved, "stderr_tail": stderr[-1500:],
                       "said_resumed": "resumed from step_00000004" in stderr}
        if returncode is None:
            out[launch]["status"] = "timeout: the part's time limit"
        common.save_partial(settings["partial"], out)
        if returncode != 0:
            break
    resumed = out.get("resumed", {})
    out["passed"] = bool(resumed.get("returncode") == 0 and "step_00000008" in resumed.get("checkpoints", [])
                         and resumed.get("said_resumed"))
    return out
