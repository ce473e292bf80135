"""What every benchmark shares: the machine record, child processes with their peak RSS,
the matmul peak, model FLOPs, and JSON + Markdown output.

Each measurement runs in a fresh child process, so peak RSS is that measurement's alone
(the child's VmHWM) and one configuration's warm caches or threads cannot help the next.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # measure the nmtkit of this checkout, whatever else is installed
    sys.path.insert(0, str(REPO))


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (other work on the machine skews timings)."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    """CPU, cores, library versions and the git commit: what a figure was measured on."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for name in ("torch", "ctranslate2", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    try:  # a copied tree (the GPU machine's) may have no git, or no repository
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip() or None
    except OSError:
        commit = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), **versions,
            "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def child_env(threads: Optional[int]) -> dict:
    """The environment for a child: ``threads`` intra-op threads for torch, OpenMP and MKL."""
    env = dict(os.environ)
    if threads:
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[key] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def peak_rss_mib(pid: int | str = "self") -> float | None:
    """VmHWM of a process in MiB: the peak resident memory of its current program. (Not
    ``ru_maxrss``: a child inherits its forking parent's peak there, so a child of a large
    parent would report at least the parent's size.)"""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def run_child(argv: Sequence[str], threads: Optional[int] = None, stdin: bytes = b"",
              timeout: float = 1800.0) -> dict:
    """Run ``argv`` with ``stdin``: its wall time, exit code, output and peak RSS (MiB; the
    child's VmHWM, polled every 10 ms until it exits)."""
    with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        inp.write(stdin)
        inp.seek(0)
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdin=inp, stdout=out, stderr=err, env=child_env(threads), cwd=REPO)
        deadline, peak = time.monotonic() + timeout, None
        while proc.poll() is None:
            peak = max(filter(None, [peak, peak_rss_mib(proc.pid)]), default=None)
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.01)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return {"returncode": proc.returncode, "wall_s": round(wall, 3), "peak_rss_mib": peak,
                "stdout": out.read().decode("utf-8", "replace"), "stderr": err.read().decode("utf-8", "replace")}


def last_json_line(text: str) -> dict:
    """The last line of a child's stdout that parses as a JSON object (its result)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON result in the child's output:\n{text[-2000:]}")


def _matmul_gflops(dtype, threads: int, size: int, seconds: float) -> float:
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    for _ in range(3):
        a @ b  # warm-up: thread pool, kernel selection
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * size ** 3 / (time.perf_counter() - start) / 1e9)
    return best


def synchronize(device) -> None:
    """Wait for a CUDA device's queued kernels (they run after the call returns); a no-op on CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cuda_matmul_peak(dtype_name: str, size: int = 8192, repeats: int = 10) -> dict:
    """The best GFLOP/s of ``repeats`` back-to-back square ``size`` matmuls on the current CUDA
    device, timed with CUDA events (the denominator of GPU MFU, measured in the same run)."""
    import torch

    dtype = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b  # warm-up: cuBLAS handle, kernel selection, clocks up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / repeats
    return {"gflops": round(2 * size ** 3 / seconds / 1e9, 1), "size": size, "dtype": dtype_name}


def matmul_peak(dtype_name: str, threads: int, seconds: float = 1.0) -> dict:
    """The matmul peak MFU is measured against: the best GFLOP/s of square 1024 and 2048
    matmuls in ``dtype_name`` (float32 / bf16) on ``threads`` threads, or ``threads`` times
    the one-thread best if that is higher (on a shared machine another process can hold a
    core during the multi-thread measurement; one thread finds a free core more easily)."""
    import torch

    dtype = {"float32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    before = torch.get_num_threads()
    try:
        multi = max(_matmul_gflops(dtype, threads, size, seconds) for size in (1024, 2048))
        single = max(_matmul_gflops(dtype, 1, size, seconds) for size in (1024, 2048))
    finally:
        torch.set_num_threads(before)
    return {"gflops": round(max(multi, single * threads), 1), "measured_threads": round(multi, 1),
            "measured_one_thread": round(single, 1), "seconds_each": seconds}


def transformer_flops(model: dict, vocab: int, src_len: float, tgt_len: float) -> dict:
    """Forward FLOPs of our Transformer per target token (2 per multiply-add), for sentences
    of mean source / target length ``src_len`` / ``tgt_len`` (padding excluded).

    Matmuls: encoder 4d^2 + 2 d ffn per source token and layer; decoder 8d^2 + 2 d ffn per
    target token and layer (self q|k|v + out, cross q + k|v + out); output projection d V.
    Attention scores and values: 2 * 2 * d * (keys) per query and layer (decoder self-
    attention counted over the full length, as computed). SwiGLU doubles fc_in.
    """
    d, ffn = model["d_model"], model["ffn_dim"] * (3 if model.get("ffn") == "swiglu" else 2)
    enc_layer = 4 * d * d + ffn * d
    dec_layer = 8 * d * d + ffn * d
    ratio = src_len / tgt_len
    matmul = ratio * model["encoder_layers"] * enc_layer + model["decoder_layers"] * dec_layer + d * vocab
    attention = (ratio * model["encoder_layers"] * 2 * d * src_len
                 + model["decoder_layers"] * 2 * d * (tgt_len + src_len))
    forward = 2 * matmul + 2 * attention
    encoder = 2 * model["encoder_layers"] * (enc_layer + 2 * d * src_len)
    return {"forward_per_tgt_token": forward, "train_per_tgt_token": 3 * forward, "encoder_per_src_token": encoder,
            "decode_step_per_row": 2 * (model["decoder_layers"] * dec_layer + d * vocab)
            + model["decoder_layers"] * 2 * 2 * d * (tgt_len / 2 + src_len)}


def operator_rows(prof, rows: int) -> list[dict]:
    """The ``rows`` operators of a ``torch.profiler`` run with the most own (self) time, each with
    its share of all operators' own time (from the unrounded times)."""
    ops = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ops) or 1.0
    ranked = sorted(ops, key=lambda e: -e.self_cpu_time_total)[:rows]
    return [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 1), "calls": e.count,
             "share_pct": round(100 * e.self_cpu_time_total / total, 2)} for e in ranked]


def write_profile(out_dir: Optional[Path], name: str, record: dict, lines: list[str]) -> str:
    """Print a profile's Markdown ``lines`` and, with ``out_dir``, write ``name``.json (``record``
    and the machine) and ``name``.md; returns the Markdown."""
    m = machine()
    text = "\n".join([*lines, "", f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}; commit "
                       f"{m['commit']}; {m['date']}."]) + "\n"
    print(text)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{name}.json").write_text(json.dumps({**record, "machine": m}, indent=1) + "\n", encoding="utf-8")
        (out_dir / f"{name}.md").write_text(text, encoding="utf-8")
    return text


def write_results(out_dir: Path, name: str, records: list[dict], columns: Sequence[tuple[str, str]],
                  title: str, notes: Sequence[str] = ()) -> tuple[Path, Path]:
    """``name``.json (machine, records) and ``name``.md (a table of ``columns``: (key, header))."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine(), "records": records}
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    lines = [f"## {title}", "", "| " + " | ".join(h for _, h in columns) + " |",
             "|" + "---|" * len(columns)]
    for record in records:
        lines.append("| " + " | ".join(_cell(record.get(key)) for key, _ in columns) + " |")
    m = payload["machine"]
    lines += ["", f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, ctranslate2 {m['ctranslate2']}, "
              f"transformers {m['transformers']}; commit {m['commit']}; {m['date']}.", *notes, ""]
    md_path = out_dir / f"{name}.md"
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def base_parser(description: str):
    """Options every benchmark takes."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True, help="nmtkit model directory (e.g. WORKDIR/train/best)")
    parser.add_argument("--data", required=True, help="prepared directory (WORKDIR/prepared)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "out"), help="where JSON and Markdown go")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    return parser


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds above 0."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def add_peak_option(parser) -> None:
    """``--peak-seconds``: how long ``matmul_peak`` times each of its four sizes and thread counts."""
    parser.add_argument("--peak-seconds", type=positive_seconds, default=1.0,
                        help="seconds per size and thread count measuring the matmul peak MFU is against "
                             "(default 1.0; a shorter one only for a quick check)")


def python() -> str:
    return sys.executable


class Skipped(Exception):
    """Raised by a measurement that cannot run here (no CUDA, a package missing): recorded with
    its reason as skipped, never as passed."""


def run_isolated(function, argument, timeout: float) -> dict:
    """``function(argument)`` in a forked child in its own process group, killed with everything
    it started when ``timeout`` seconds pass, or when the caller is interrupted (a signal handler
    raising in the caller: the check stopped by ``timeout`` from outside). Forked, not spawned:
    the child inherits the imports (torch costs seconds per fresh process), so the caller must
    not have initialised CUDA.

    Returns {"status": "ok", "value"} | {"status": "skipped", "reason"} | {"status": "error",
    "cause", "traceback"} | {"status": "timeout"} | {"status": "crashed", "exitcode"}, plus
    "seconds" (wall time)."""
    import multiprocessing
    import uuid

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_isolated_child, args=(function, argument, send), daemon=False)
    token, before = uuid.uuid4().hex, os.environ.get(ISOLATION_MARKER)
    os.environ[ISOLATION_MARKER] = token  # inherited by every program the child starts
    start = time.perf_counter()
    try:
        child.start()
    finally:
        _restore_marker(before)
    _own_group(child.pid)  # set here too: a kill before the child ran must still find its group
    send.close()
    try:
        outcome = _wait_for(child, receive, timeout, start)
        child.join(5 if outcome["status"] != "timeout" else 0)
    finally:  # the child and whatever it left running (training processes, torchrun and its workers)
        _kill_group(child.pid)
        kill_marked(token)
        child.join(5)
        receive.close()
    return {**outcome, "seconds": round(time.perf_counter() - start, 2)}


ISOLATION_MARKER = "NMTKIT_ISOLATED_RUN"


def _restore_marker(before: str | None) -> None:
    if before is None:
        os.environ.pop(ISOLATION_MARKER, None)
    else:
        os.environ[ISOLATION_MARKER] = before


def kill_marked(token: str) -> list[int]:
    """SIGKILL every program started with ``ISOLATION_MARKER=token`` in its environment: what an
    isolated function left running outside its process group (torchrun puts each worker in a
    session of its own). The pids killed; none where there is no /proc."""
    import signal

    needle, killed = f"\0{ISOLATION_MARKER}={token}\0".encode(), []
    try:
        entries = [entry for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return killed
    for entry in entries:
        try:
            if needle in b"\0" + (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except OSError:  # exited meanwhile, or another user's
            pass
    return killed


def _own_group(pid: int) -> None:
    try:
        os.setpgid(pid, pid)
    except OSError:  # the child set it itself first, or has already exited
        pass


def _kill_group(pid: int) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for(child, receive, timeout: float, start: float) -> dict:
    """The child's outcome, or a timeout / crash record."""
    while True:
        left = timeout - (time.perf_counter() - start)
        if left <= 0:
            return {"status": "timeout"}
        if receive.poll(min(left, 0.2)):
            try:
                return receive.recv()
            except EOFError:  # the child died without a word (a signal, the OOM killer)
                child.join(5)
                return {"status": "crashed", "exitcode": child.exitcode}


def _isolated_child(function, argument, send) -> None:
    import signal
    import traceback

    os.setpgid(0, 0)  # one group: the parent can stop this child and its children together
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # not the parent's handlers
        signal.signal(number, signal.SIG_DFL)
    try:
        outcome = {"status": "ok", "value": function(argument)}
    except Skipped as why:
        outcome = {"status": "skipped", "reason": str(why)}
    except BaseException as err:  # isolation: any failure is a record, not the end of the check
        first = (str(err).strip().splitlines() or [""])[0]
        outcome = {"status": "error", "cause": f"{type(err).__name__}: {first}"[:500],
                   "traceback": traceback.format_exc()[-4000:]}
    send.send(outcome)
    send.close()


def save_partial(path: str | Path, payload: dict) -> None:
    """What a part has measured so far, replaced whole (written beside, then renamed), so the
    check reads a complete file even when the part is killed in the middle of saving."""
    from nmtkit.storage.files import atomic_write_text

    atomic_write_text(path, json.dumps(payload, default=str))


def read_partial(path: str | Path) -> dict | None:
    """A part's saved figures, or None when it saved none (or none readable)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
