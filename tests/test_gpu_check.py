"""The GPU check (benchmarks/gpu_check.py) in its CPU mode, run as the GPU machine would run it:
without datasets, ctranslate2 or starlette. Every part is present; the correctness parts that
can run on CPU pass; those that need CUDA say so and are never reported as passed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
import gpu_check  # noqa: E402

# the packages the GPU machine lacks: importing one fails, as it would there
WITHOUT_PACKAGES = """
import importlib.abc, runpy, sys
ABSENT = {"datasets", "ctranslate2", "starlette", "uvicorn"}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
script = sys.argv[1]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", WITHOUT_PACKAGES, str(REPO / "benchmarks" / "gpu_check.py"),
                           "--out", str(out), "--device", "cpu", "--tiny"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))
    return payload, (out / "gpu_check.md").read_text(encoding="utf-8")


def test_every_part_runs_and_the_correctness_parts_pass_on_cpu(check):
    payload, _ = check
    parts = payload["parts"]
    assert list(parts) == list(gpu_check.LIMITS)
    status = {name: record["status"] for name, record in parts.items()}
    assert status == {"device": "measured", "invariants": "passed", "training": "passed", "resume": "passed",
                      "kernels": "skipped", "profile": "measured", "train_speed": "measured", "quickstart": "measured",
                      "decode": "measured", "torchrun": "skipped"}, {n: parts[n].get("cause") for n in parts}
    for name in ("kernels", "torchrun"):
        assert parts[name]["reason"].startswith("needs CUDA") and "result" not in parts[name]
    for record in parts.values():
        assert isinstance(record["seconds"], float) and 0 <= record["seconds"] <= record["limit_s"]


def test_correctness_figures_are_numbers_within_their_tolerances(check):
    parts = check[0]["parts"]
    invariants = parts["invariants"]["result"]
    assert {r["variant"] for r in invariants["records"]} == set(gpu_check.VARIANTS)
    for record in invariants["records"]:
        worst = max(record["incremental_vs_full"], record["batched_vs_one"], record["padded_vs_unpadded"])
        assert 0 <= worst <= invariants["tolerance"][record["dtype"]], record
    training = parts["training"]["result"]
    assert training["same_device"] and training["max_rel_diff_vs_cpu"] == 0.0  # CPU against itself: exact
    for dtype in ("bf16", "fp16"):
        losses = [x for x in training[dtype]["losses"] if x is not None]
        assert len(losses) >= training["steps"] - 2 and training[dtype]["end_rel_diff_vs_float32"] <= 0.05
    assert training["float32"]["losses"][-1] < training["float32"]["losses"][0]  # the copy task is learnt
    resume = parts["resume"]["result"]["deterministic"]
    assert resume["killed"] and resume["bit_identical"] and resume["max_abs_diff"] == 0.0 and resume["tensors"] > 10


def test_speed_figures_are_numbers_and_skips_say_why(check):
    parts = check[0]["parts"]
    for record in parts["train_speed"]["result"]["records"]:
        if "status" in record:
            assert record["status"].startswith(("skipped: ", "not reached: ")), record
        else:
            assert record["tgt_tok_s"] > 0 and record["step_s"] > 0 and record["max_tokens"] > 0, record
    measured = [r for r in parts["train_speed"]["result"]["records"] if "tgt_tok_s" in r]
    assert {r["run"] for r in measured} >= {"base-bf16", "big-bf16", "base-fp16", "base-float32", "base-bf16-unchunked"}
    decode = parts["decode"]["result"]["records"]
    timed = [r for r in decode if "sent_s" in r]
    assert {r["config"] for r in timed} >= {"quickstart torch bf16 beam 4", "quickstart torch float32 beam 1",
                                             "quickstart torch bf16 beam 4 batch_tokens 32000",
                                             "quickstart torch bf16 beam 4 batch_tokens 128000",
                                             "base forced bf16 beam 4", "base forced float32 beam 1"}
    for record in timed:
        assert record["sent_s"] > 0 and record["tgt_tok_s"] > 0
    assert all(r["same_as_8000"] for r in timed if "batch_tokens" in r["config"])  # batching changed no line
    for record in (r for r in timed if "forced_len" in r):
        assert record["tgt_tokens"] == record["sentences"] * record["forced_len"]  # exactly the forced length
    assert {"config": "quickstart ctranslate2", "status": "skipped: ctranslate2 does not import"} in decode
    quickstart = parts["quickstart"]["result"]
    assert quickstart["wall_s"] > 0 and 0 <= quickstart["test_bleu"] <= 100 and quickstart["steps"] == 4
    assert 0 <= quickstart["train_minutes"] * 60 < quickstart["wall_s"] and quickstart["train_tgt_tok_s"] > 0


def test_the_profile_names_where_an_update_spends_its_time(check):
    profile = check[0]["parts"]["profile"]["result"]
    assert profile["updates"] == 4 and profile["wall_ms_per_update"] > 0  # the tiny mode's 4
    assert profile["device_busy_pct"] is None and profile["kernels_per_update"] == 0  # no CUDA kernels on a CPU
    names = [row["name"] for row in profile["top_host"]]
    assert len(names) == 15 and len(set(names)) == 15
    assert any(name in ("aten::mm", "aten::addmm", "aten::bmm") for name in names)  # matmuls are among the costs
    costs = [row["ms_per_update"] for row in profile["top_host"]]
    assert costs == sorted(costs, reverse=True) and costs[-1] > 0


def test_the_markdown_has_a_row_per_part(check):
    payload, text = check
    assert text.startswith("## GPU check")
    for name, record in payload["parts"].items():
        assert f"| {name} | {record['status']} |" in text


def test_a_failing_hanging_or_crashing_part_is_recorded_and_stopped():
    def fails(_):
        raise ValueError("bad input\nsecond line")

    def hangs(_):
        time.sleep(60)

    def crashes(_):
        os._exit(3)

    def skips(_):
        raise common.Skipped("needs CUDA")

    failed = common.run_isolated(fails, None, 30)
    assert failed["status"] == "error" and failed["cause"] == "ValueError: bad input"
    assert "raise ValueError" in failed["traceback"]
    start = time.perf_counter()
    assert common.run_isolated(hangs, None, 1)["status"] == "timeout"
    assert time.perf_counter() - start < 10
    assert common.run_isolated(crashes, None, 30)["status"] == "crashed"
    assert common.run_isolated(skips, None, 30) == {"status": "skipped", "reason": "needs CUDA",
                                                    "seconds": pytest.approx(0, abs=10)}
    assert common.run_isolated(lambda x: x + 1, 41, 30)["value"] == 42


def test_unpadded_batches_reach_sdpa_without_a_mask(monkeypatch):
    """SDPA's flash kernel takes no mask: a batch without padding must not pass one (encoder
    self-attention and cross-attention), and the logits are those of the masked computation."""
    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1,
                                    dropout=0.0), 24, 24).eval()
    src = torch.randint(4, 24, (2, 5))
    tgt = torch.randint(4, 24, (2, 4))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        unmasked = model(src, src.ne(0), tgt)
        assert len(seen) == 3 and all(mask is None for mask in seen)  # encoder self, decoder self, cross
        seen.clear()
        padded = model(torch.cat([src, torch.zeros(2, 1, dtype=torch.long)], 1),
                       torch.cat([src.ne(0), torch.zeros(2, 1, dtype=torch.bool)], 1), tgt)
    assert [mask is None for mask in seen] == [False, True, False]  # decoder self-attention: is_causal
    torch.testing.assert_close(unmasked, padded, atol=1e-6, rtol=1e-6)


def processes_marked(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker`` (forked children inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # exited meanwhile, or not ours
            pass
    return found


def test_a_check_stopped_from_outside_ends_its_part_and_keeps_what_finished(tmp_path):
    """The device command runs the check under ``timeout``: its SIGTERM must end the running part
    with everything that part started (they sit in their own process group, out of the signal's
    reach) and leave the finished parts, the stopped one and those not run in gpu_check.json."""
    import signal
    import uuid

    marker = f"GPU_CHECK_TEST_{uuid.uuid4().hex}"
    out = tmp_path / "out"
    env = {**os.environ, marker: "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    check = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(out),
                              "--device", "cpu", "--tiny", "--parts", "device,resume,decode"],
                             cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # the JSON names the running part before it starts
            record = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else {}
            if record.get("parts", {}).get("resume", {}).get("status") == "running":
                break
            time.sleep(0.05)
        while time.monotonic() < deadline and len(processes_marked(marker)) < 3:
            time.sleep(0.05)  # into the part: beside the check and the part, a training process runs
        assert len(processes_marked(marker)) >= 3, "no training process of the part started"
        check.send_signal(signal.SIGTERM)
        _, stderr = check.communicate(timeout=30)
    finally:
        check.kill()
    assert check.returncode == 1, stderr.decode()[-2000:]
    assert "gpu_check: stopped: the check was stopped from outside (SIGTERM)" in stderr.decode()
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    assert [(name, parts[name]["status"]) for name in parts] == [
        ("device", "measured"), ("resume", "stopped"), ("decode", "not run")]
    assert 0 < parts["resume"]["seconds"] < 30 and "result" not in parts["resume"]
    assert "| resume | stopped |" in (out / "gpu_check.md").read_text()
    time.sleep(0.5)  # SIGKILLed processes leave /proc once reaped
    assert processes_marked(marker) == []


def test_a_partial_record_cut_mid_write_reads_as_none(tmp_path):
    """A part killed while saving its figures must not break the check that reads them."""
    path = tmp_path / "part.partial.json"
    assert common.read_partial(path) is None
    common.save_partial(path, {"records": [{"run": "base-bf16", "tgt_tok_s": 1.5}]})
    assert common.read_partial(path) == {"records": [{"run": "base-bf16", "tgt_tok_s": 1.5}]}
    assert [p.name for p in tmp_path.iterdir()] == ["part.partial.json"]  # no temporary left beside it
    path.write_text('{"records": [{"run": "ba', encoding="utf-8")
    assert common.read_partial(path) is None


def test_a_restricted_sdpa_backend_that_cannot_run_raises_what_the_kernels_part_catches():
    """The kernels part proves a backend serves a step by restricting SDPA to it: a backend that
    cannot run must raise RuntimeError (recorded as that backend's error), not fall back."""
    import gpu_kernels

    q = torch.randn(1, 2, 5, 8)
    with torch.nn.attention.sdpa_kernel(gpu_kernels.backend_sets()["efficient"]):  # no CPU kernel
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with torch.nn.attention.sdpa_kernel(gpu_kernels.backend_sets()["math"]):
        torch.testing.assert_close(torch.nn.functional.scaled_dot_product_attention(q, q, q),
                                   (q @ q.transpose(-1, -2) / 8 ** 0.5).softmax(-1) @ q)


def test_the_kernels_probe_times_every_backend_set_or_names_its_error():
    """probe() on CPU (bf16 attention there is explicit matmuls, outside SDPA's backends): every
    backend set is timed, with the device drained around each timing."""
    import gpu_kernels
    from nmtkit.config import ModelConfig
    from nmtkit.models.build import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=16, ffn_dim=32, heads=2, encoder_layers=1, decoder_layers=1,
                                    dropout=0.0), gpu_kernels.VOCAB, gpu_kernels.VOCAB)
    for case in ("train-padded", "decode-padded"):
        record = gpu_kernels.probe(model, case, torch.device("cpu"))
        assert set(record) == {"default_ms", *(f"{name}_ms" for name in gpu_kernels.backend_sets())}, record
        assert all(ms > 0 for ms in record.values()), record


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed and not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_program_a_part_started_in_a_session_of_its_own_is_stopped_with_the_part(tmp_path):
    """torchrun starts its workers in sessions of their own, out of reach of the part's process
    group: whatever a part started is stopped with it all the same, by its environment's mark."""
    pid_file = tmp_path / "pid"

    def starts_a_session_and_hangs(_):
        sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        pid_file.write_text(str(sleeper.pid))
        time.sleep(60)

    assert common.run_isolated(starts_a_session_and_hangs, None, 3)["status"] == "timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)
    assert common.ISOLATION_MARKER not in os.environ  # the mark is the part's alone


ASKING_CUDA = """
import json, sys, torch
asked = []
def recording(name, original):
    def call(*args, **kwargs):
        asked.append(name)
        return original(*args, **kwargs)
    return call
for name in ("is_available", "device_count", "_lazy_init", "init", "is_bf16_supported", "get_device_properties"):
    setattr(torch.cuda, name, recording(name, getattr(torch.cuda, name)))
sys.path.insert(0, sys.argv[1])
import gpu_check
payload = gpu_check.main(sys.argv[2:])
print(json.dumps({"asked": asked, "device": payload["parts"]["device"]["status"]}))
"""


def test_the_check_itself_never_asks_cuda_so_its_forked_parts_can_use_it(tmp_path):
    """Each part is forked from the check's process, and a process forked after its parent asked
    CUDA anything (torch.cuda.is_available() included) cannot use CUDA: the parent must not ask,
    in all it does for a CUDA run (its imports, the machine record, the parts' modules)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", ASKING_CUDA, str(REPO / "benchmarks"), "--out", str(tmp_path),
                           "--device", "cuda", "--parts", "device", "--data", str(tmp_path / "data")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["asked"] == []
    assert record["device"] == ("measured" if torch.cuda.is_available() else "error")  # the part asked, forked


def test_chosen_training_runs_run_in_order_with_repeats_and_a_part_limit_can_be_set(tmp_path):
    """--train-runs repeats a run (the noise between runs on one GPU is +-5%); --limit sets one
    part's time limit; a name it does not know is a one-line error before anything runs."""
    payload = gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--parts", "train_speed",
                              "--train-runs", "base-bf16,base-bf16-unchunked,base-bf16", "--limit", "train_speed=45"])
    part = payload["parts"]["train_speed"]
    assert part["limit_s"] == 45
    runs = [record["run"] for record in part["result"]["records"]]
    assert runs == ["base-bf16", "base-bf16-unchunked", "base-bf16"]
    assert all(record["tgt_tok_s"] > 0 for record in part["result"]["records"])
    for bad in (["--train-runs", "base-bf17"], ["--limit", "train_speed=soon"], ["--limit", "nothing=5"]):
        with pytest.raises(SystemExit) as stopped:
            gpu_check.main(["--out", str(tmp_path / "bad"), "--device", "cpu", "--tiny", *bad])
        assert stopped.value.code == 2
    assert not (tmp_path / "bad").exists()
