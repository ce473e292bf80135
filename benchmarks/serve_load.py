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
4. With ``--adversaries N``: runs the same honest clients again beside N slow uploaders
   (headers, then a byte every ``--drip-s``, until the server's ``--read-timeout`` cuts them
   with 408; then again) and N clients sending requests inside every count limit but over
   the memory bound (2,000-character texts, 32 phrases of 60 words, beam 16: each must be a
   413 refused before any search). The honest latency of both passes is reported side by side.
5. SIGTERMs the server, which must exit 0.

Reports p50/p99/max latency, lines/s served vs batch, requests per model call (from
/health), refusals by reason (from /metrics), and exits 1 if any request went unanswered,
wrong, malformed requests were not refused, or an adversary was not stopped. Both processes
share the machine: on few cores the clients' own CPU counts.
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
            "--engine", args.engine, "--batch-window-ms", str(args.window_ms), "--read-timeout", str(args.read_timeout)]
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


def slow_upload(port: int, drip_s: float, stop: threading.Event, out: dict) -> None:
    """Headers of a 100 kB body, then one byte every ``drip_s`` until the server answers and
    closes (a 408 counts as cut); again until ``stop`` is set after at least one attempt."""
    while True:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(drip_s)
            sock.sendall(b"POST /translate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100000\r\n\r\n{")
            reply = b""
            while True:
                try:
                    chunk = sock.recv(4096)
                except socket.timeout:
                    try:
                        sock.sendall(b" ")
                    except OSError:
                        break
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                reply += chunk
        out["cut" if reply.startswith(b"HTTP/1.1 408 ") else "not_cut"] += 1
        if stop.is_set():
            return


def costly_body(lines: list[str]) -> bytes:
    """A request inside every default count limit whose search would need tens of gigabytes."""
    words = " ".join(lines).split() or ["a"]
    phrase = " ".join(words[i % len(words)] for i in range(60))[:2000].strip()  # within --max-line-chars
    return json.dumps({"texts": [" ".join(words * 2000)[:2000]], "constraints": [[phrase] * 32],
                       "beam_size": 16}).encode()


def costly_client(port: int, body: bytes, stop: threading.Event, out: dict) -> None:
    """Sends ``body`` again and again until ``stop``; each answer must be a 413 JSON error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    while True:
        start = time.perf_counter()
        try:
            status, payload = request(conn, "POST", "/translate", body)
            refused = status == 413 and "--max-search-bytes" in payload.get("error", "")
        except (OSError, ValueError, http.client.HTTPException):
            conn.close()
            conn, refused = http.client.HTTPConnection("127.0.0.1", port, timeout=300), False
        out["refused" if refused else "not_refused"] += 1
        out["refusal_s"] = max(out["refusal_s"], time.perf_counter() - start)
        if stop.is_set():
            conn.close()
            return


def adversaries(args, port: int, lines: list[str]) -> tuple[list[threading.Thread], threading.Event, list[dict]]:
    """``args.adversaries`` slow uploaders and as many over-cost clients, started; each
    counts its outcomes in a dict of its own (summed once they have stopped)."""
    stop, body = threading.Event(), costly_body(lines)
    outs = [{"cut": 0, "not_cut": 0, "refused": 0, "not_refused": 0, "refusal_s": 0.0}
            for _ in range(2 * args.adversaries)]
    threads = [threading.Thread(target=slow_upload, args=(port, args.drip_s, stop, out))
               for out in outs[:args.adversaries]]
    threads += [threading.Thread(target=costly_client, args=(port, body, stop, out)) for out in outs[args.adversaries:]]
    for thread in threads:
        thread.start()
    return threads, stop, outs


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


def under_attack(args, port: int, plans: list[list[list[str]]], reference: dict[str, str], lines: list[str]) -> dict:
    """The honest load again beside the adversaries; its latency, and whether every slow
    upload was cut (408) and every over-cost request refused (413)."""
    threads, stop, outs = adversaries(args, port, lines)
    served = load(args, port, plans, reference)
    stop.set()
    for thread in threads:
        thread.join()
    out = {key: sum(each[key] for each in outs) for key in ("cut", "not_cut", "refused", "not_refused")}
    out["refusal_s"] = max(each["refusal_s"] for each in outs)
    held = (out["cut"] > 0 and not out["not_cut"] and out["refused"] > 0 and not out["not_refused"]
            and served["answered"] == len(plans) * args.requests and not served["wrong"])
    return {**{f"attacked_{key}": value for key, value in served.items() if key != "first_errors"},
            "adversaries": args.adversaries, "slow_uploads_cut": out["cut"], "slow_uploads_not_cut": out["not_cut"],
            "costly_refused": out["refused"], "costly_not_refused": out["not_refused"],
            "costly_refusal_max_ms": round(1000 * out["refusal_s"], 1), "adversaries_held": held}


def server_counts(port: int) -> tuple[dict, dict[str, str]]:
    """/health's counters, and /metrics's refusals by reason."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    health = request(conn, "GET", "/health")[1]
    conn.request("GET", "/metrics")
    rejected = dict(re.findall(r'nmtkit_rejected_requests_total\{reason="(\w+)"\} (\d+)',
                               conn.getresponse().read().decode()))
    conn.close()
    return health, rejected


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
    parser.add_argument("--adversaries", type=int, default=0,
                        help="a second pass beside this many slow uploaders and as many over-cost clients")
    parser.add_argument("--read-timeout", type=float, default=5.0, help="the server's --read-timeout (seconds)")
    parser.add_argument("--drip-s", type=float, default=0.5, help="seconds between a slow uploader's bytes")
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
        attacked = under_attack(args, port, plans, reference, lines) if args.adversaries else {}
        health, rejected = server_counts(port)
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
              "rejected": {reason: int(count) for reason, count in rejected.items() if count != "0"},
              **attacked, "load_average": common.load_average()}
    ok = (served["answered"] == record["requests_planned"] and not served["wrong"] and all(malformed.values())
          and exit_code == 0 and attacked.get("adversaries_held", True))
    record["ok"] = ok
    columns = [("engine", "engine"), ("clients", "clients"), ("answered", "answered"), ("wrong", "wrong"),
               ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("lines_s", "served lines/s"),
               ("batch_lines_s", "batch lines/s"), ("requests_per_batch", "requests/model call"),
               ("malformed_refused", "malformed refused"), ("attacked_p50_ms", "p50 ms under attack"),
               ("attacked_p99_ms", "p99 ms under attack"), ("ok", "ok")]
    common.write_results(Path(args.out), "serve_load", [record], columns, "nmtkit serve under load (loopback)",
                         notes=[f"Failed malformed checks: {[k for k, v in malformed.items() if not v]}"])
    print(json.dumps(record))
    if not ok:
        raise SystemExit(1)
    return record


if __name__ == "__main__":
    main()
