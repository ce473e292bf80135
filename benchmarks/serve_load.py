"""Load test of ``nmtkit serve`` on loopback, bounded in requests and time.

    python benchmarks/serve_load.py --model WORKDIR/train/averaged --input WORKDIR/prepared/test.en \\
        --clients 32 --requests 100 --max-lines 8 --time-limit 900

1. Plans ``--clients`` x ``--requests`` requests of 1..``--max-lines`` lines drawn (seeded)
   from ``--input``, and translates all their lines once with batch ``nmtkit translate``
   (the reference answers, and the batch lines/s to compare with).
2. Starts ``nmtkit serve --port 0`` on 127.0.0.1 and sends malformed requests (bad JSON,
   invalid UTF-8, an oversized body, too many lines, a too-long line, unknown and
   out-of-range settings): each must be a 4xx JSON error. Two clients leave early: one
   mid-body, one before its answer.
3. Runs the clients, each on its own keep-alive connection, one request after another;
   every answer must equal the reference lines. No new request starts after ``--time-limit``.
4. SIGTERMs the server, which must exit 0.

Reports p50/p99/max latency, lines/s served vs batch, requests per model call (from
/health), and exits 1 if any request went unanswered, wrong, or malformed requests were
not refused. Both processes share the machine: on few cores the clients' own CPU counts.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import common

MALFORMED = {  # name -> (body, expected status); limits are the server's defaults
    "bad JSON": (b'{"texts": ["a"', 400),
    "invalid UTF-8": (b'{"texts": ["\xff\xfe"]}', 400),
    "oversized body": (b'{"texts": ["' + b"a " * (1 << 20) + b'"]}', 413),
    "too many lines": (json.dumps({"texts": ["a"] * 257}).encode(), 413),
    "too-long line": (json.dumps({"texts": ["a" * 2001]}).encode(), 413),
    "unknown option": (json.dumps({"texts": ["a"], "beem_size": 4}).encode(), 400),
    "out-of-range option": (json.dumps({"texts": ["a"], "beam_size": 1000}).encode(), 400),
    "not an object": (b"[1, 2]", 400),
}


def plan_requests(lines: list[str], clients: int, requests: int, max_lines: int, seed: int) -> list[list[list[str]]]:
    rng = random.Random(seed)
    return [[rng.choices(lines, k=rng.randint(1, max_lines)) for _ in range(requests)] for _ in range(clients)]


def batch_reference(args, lines: list[str]) -> tuple[dict[str, str], dict]:
    """Batch ``nmtkit translate`` of ``lines``: translation per line, and its lines/s net of
    start-up (the wall time of the same command on empty input), as the server's excludes it."""
    argv = [sys.executable, "-m", "nmtkit", "translate", "-m", args.model, "--device", args.device,
            "--engine", args.engine]
    startup = common.run_child(argv, threads=args.threads, stdin=b"")
    run = common.run_child(argv, threads=args.threads, stdin="".join(f"{s}\n" for s in lines).encode())
    if run["returncode"] != 0 or startup["returncode"] != 0:
        raise SystemExit(f"nmtkit translate failed:\n{run['stderr'][-2000:]}{startup['stderr'][-2000:]}")
    outputs = run["stdout"].splitlines()
    assert len(outputs) == len(lines), "translate must write one line per line"
    net = max(run["wall_s"] - startup["wall_s"], 1e-3)
    return dict(zip(lines, outputs)), {"wall_s": run["wall_s"], "startup_s": startup["wall_s"], "lines": len(lines),
                                       "lines_s": round(len(lines) / net, 1)}


def start_server(args) -> tuple[subprocess.Popen, int]:
    argv = [sys.executable, "-m", "nmtkit", "serve", "-m", args.model, "--port", "0", "--device", args.device,
            "--engine", args.engine, "--batch-window-ms", str(args.window_ms)]
    server = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=common.child_env(args.threads),
                              cwd=common.REPO)
    for raw in server.stderr:
        found = re.search(r"http://127\.0\.0\.1:(\d+)", raw.decode("utf-8", "replace"))
        if found:
            threading.Thread(target=server.stderr.read, daemon=True).start()  # keep the pipe drained
            return server, int(found.group(1))
    raise SystemExit(f"nmtkit serve did not start (exit {server.wait()})")


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b"") -> tuple[int, dict]:
    conn.request(method, path, body=body or None, headers={"content-type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def check_malformed(port: int) -> dict[str, bool]:
    """Each malformed request answered with its 4xx and a JSON error (fresh connection each:
    the server may close one after refusing a body it did not read)."""
    passed = {}
    for name, (body, status) in MALFORMED.items():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            got, payload = request(conn, "POST", "/translate", body)
            passed[name] = got == status and isinstance(payload.get("error"), str)
        except (OSError, ValueError, http.client.HTTPException):
            passed[name] = False
        finally:
            conn.close()
    return passed


def leave_early(port: int, lines: list[str]) -> None:
    """One client closes mid-body, another right after sending its request."""
    body = json.dumps({"texts": lines}).encode()
    head = b"POST /translate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as half:
        half.sendall(head % len(body) + body[:len(body) // 2])
    with socket.create_connection(("127.0.0.1", port)) as impatient:
        impatient.sendall(head % len(body) + body)


def run_client(port: int, plan: list[list[str]], reference: dict[str, str], deadline: float, out: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    for texts in plan:
        if time.monotonic() > deadline:
            break
        start = time.perf_counter()
        try:
            status, payload = request(conn, "POST", "/translate", json.dumps({"texts": texts}).encode())
        except (OSError, ValueError, http.client.HTTPException) as err:
            out["errors"].append(f"{type(err).__name__}: {err}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            continue
        out["latencies"].append(time.perf_counter() - start)
        out["lines"] += len(texts)
        if status != 200 or payload.get("translations") != [reference[t] for t in texts]:
            out["wrong"] += 1
    conn.close()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load(args, port: int, plans: list[list[list[str]]], reference: dict[str, str]) -> dict:
    out = {"latencies": [], "lines": 0, "wrong": 0, "errors": []}
    deadline = time.monotonic() + args.time_limit
    threads = [threading.Thread(target=run_client, args=(port, plan, reference, deadline, out)) for plan in plans]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    latencies = out["latencies"]  # list.append is atomic: threads share it safely
    return {"wall_s": round(wall, 2), "answered": len(latencies), "wrong": out["wrong"],
            "errors": len(out["errors"]), "first_errors": out["errors"][:3], "lines": out["lines"],
            "lines_s": round(out["lines"] / wall, 1),
            **{f"{name}_ms": round(1000 * value, 1) if value is not None else None
               for name, value in (("p50", percentile(latencies, 0.5)), ("p99", percentile(latencies, 0.99)),
                                   ("max", max(latencies, default=None)))}}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model directory (ctranslate2: an export)")
    parser.add_argument("--input", required=True, help="source lines to draw requests from")
    parser.add_argument("--engine", default="torch", help="torch or ctranslate2")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads of translate and serve")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    parser.add_argument("--max-lines", type=int, default=8, help="lines per request: 1 to this")
    parser.add_argument("--window-ms", type=float, default=5.0, help="the server's --batch-window-ms")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds after which no request starts")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(common.REPO / "benchmarks" / "out"), help="where JSON and Markdown go")
    args = parser.parse_args(argv)
    lines = [s for s in Path(args.input).read_text(encoding="utf-8").splitlines() if s.strip()]
    plans = plan_requests(lines, args.clients, args.requests, args.max_lines, args.seed)
    planned = [t for plan in plans for texts in plan for t in texts]
    reference, batch = batch_reference(args, list(dict.fromkeys(planned)))  # each distinct line once
    server, port = start_server(args)
    try:
        malformed = check_malformed(port)
        leave_early(port, lines[:4])
        served = load(args, port, plans, reference)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        health = request(conn, "GET", "/health")[1]
        conn.close()
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(120)
    finally:
        if server.poll() is None:
            server.kill()
    record = {"engine": args.engine, "clients": args.clients, "requests_planned": args.clients * args.requests,
              **served, "batch_lines_s": batch["lines_s"], "batch_wall_s": batch["wall_s"],
              "batch_startup_s": batch["startup_s"], "batch_distinct_lines": batch["lines"],
              "served_vs_batch": round(served["lines_s"] / batch["lines_s"], 2),
              "requests_per_batch": round(health["requests"] / max(health["batches"], 1), 2),
              "malformed_refused": f"{sum(malformed.values())}/{len(malformed)}", "server_exit": exit_code,
              "load_average": common.load_average()}
    ok = (served["answered"] == record["requests_planned"] and not served["wrong"] and all(malformed.values())
          and exit_code == 0)
    record["ok"] = ok
    columns = [("engine", "engine"), ("clients", "clients"), ("answered", "answered"), ("wrong", "wrong"),
               ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("lines_s", "served lines/s"),
               ("batch_lines_s", "batch lines/s"), ("requests_per_batch", "requests/model call"),
               ("malformed_refused", "malformed refused"), ("ok", "ok")]
    common.write_results(Path(args.out), "serve_load", [record], columns, "nmtkit serve under load (loopback)",
                         notes=[f"Failed malformed checks: {[k for k, v in malformed.items() if not v]}"])
    print(json.dumps(record))
    if not ok:
        raise SystemExit(1)
    return record


if __name__ == "__main__":
    main()
