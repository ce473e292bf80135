"""``nmtkit serve`` on a tiny reversal model: answers equal ``translate`` of the same lines,
requests arriving together share model calls without mixing, every malformed request is
a 4xx JSON error, and SIGTERM lets a request in flight finish."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import concurrently, reversal_pairs, sequences, tagged_model, train_tiny
from nmtkit.decoding.options import TranslateOptions
from nmtkit.decoding.translate import Translator
from nmtkit.translate_files import open_engine
from support.cli import cli_in_process, run_cli

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")  # Starlette's TestClient

from starlette.testclient import TestClient  # noqa: E402

from nmtkit.serving.app import create_app, serving_card  # noqa: E402
from nmtkit.serving.batcher import Batcher  # noqa: E402
from nmtkit.serving.requests import Limits  # noqa: E402

CPU = dict(device="cpu", dtype="float32")
LIMITS = Limits(max_body_bytes=4000, max_lines=6, max_line_chars=60, max_beam=4)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, reversal_spm) -> Path:
    return train_tiny(reversal_spm, tmp_path_factory.mktemp("serve") / "model", steps=60)


def sources(n: int, seed: int) -> list[str]:
    return [s for s, _ in reversal_pairs(n, seed, length=5)]


def start_app(model_dirs: list[str], options: TranslateOptions, window_s: float = 0.0):
    batcher = Batcher(open_engine(model_dirs, options), options, window_s, options.batch_tokens)
    return TestClient(create_app(batcher, serving_card(model_dirs, options, LIMITS, window_s * 1000, batcher.engine.description), LIMITS))


def expected(model_dirs: list[str], lines: list[str], **settings) -> list[str]:
    """What the translate front end writes for ``lines`` (tab-separated fields)."""
    options = TranslateOptions(**CPU, **settings)
    return Translator(open_engine(model_dirs, options), options).translate(lines)


@pytest.fixture(scope="module")
def client(model_dir):
    with start_app([str(model_dir)], TranslateOptions(**CPU)) as test_client:
        yield test_client


def test_answers_equal_translate_with_scores_alignments_and_nbest(client, model_dir):
    lines = sources(5, 1)
    lines[2] = ""
    plain = client.post("/translate", json={"texts": lines})
    assert plain.status_code == 200 and set(plain.json()) == {"translations"}
    assert plain.json()["translations"] == expected([str(model_dir)], lines)
    rich = client.post("/translate", json={"texts": lines, "beam_size": 3, "nbest": 2, "scores": True,
                                           "alignments": True, "lenpen": 1.0, "max_len_b": 8}).json()
    reference = expected([str(model_dir)], lines, beam_size=3, nbest=2, alignments=True, lenpen=1.0, max_len_b=8)
    for hyps, best, score, alignment, ref in zip(rich["nbest"], rich["translations"], rich["scores"],
                                                 rich["alignments"], reference):
        rows = [row.split("\t") for row in ref.split("\n")]  # index, score, text, alignment
        rows = [row for row in rows if row[1] != "-inf"]  # the text format's padding to N lines
        assert [[h["text"], f"{h['score']:.4f}", h["alignment"]] for h in hyps] == [[r[2], r[1], r[3]] for r in rows]
        assert (best, score, alignment) == (hyps[0]["text"], hyps[0]["score"], hyps[0]["alignment"])
    assert client.post("/translate", json={"texts": []}).json() == {"translations": []}


def test_alignment_units_need_alignments_as_in_translate(client, model_dir):
    """Without "alignments": true the units would be accepted and ignored (a 200 without
    alignments), where translate refuses --alignment-units without --alignments."""
    lines = sources(3, 5)
    for settings in ({"alignment_units": "pieces"}, {"alignment_units": "words", "alignments": False}):
        refused = client.post("/translate", json={"texts": lines, **settings})
        assert refused.status_code == 400, refused.text
        assert refused.json() == {"error": 'alignment_units applies to "alignments": true only'}
    pieces = client.post("/translate", json={"texts": lines, "alignments": True, "alignment_units": "pieces"})
    assert pieces.status_code == 200, pieces.text
    answer = pieces.json()
    assert [f"{text}\t{pairs}" for text, pairs in zip(answer["translations"], answer["alignments"])] == \
        expected([str(model_dir)], lines, alignments=True, alignment_units="pieces")


def test_prefixes_and_constraints_per_text_answer_like_translate(client, model_dir):
    from nmtkit.decoding.guides import Guide

    lines = sources(4, 3)
    prefixes, constraints = ["", "a b", "", "j"], [["c"], [], [], ["d e", "f"]]
    body = {"texts": lines, "prefixes": prefixes, "constraints": constraints, "beam_size": 3, "nbest": 2}
    answer = client.post("/translate", json=body).json()
    options = TranslateOptions(**CPU, beam_size=3)
    guides = [Guide.of(prefix, phrases) for prefix, phrases in zip(prefixes, constraints)]
    assert answer["translations"] == Translator(open_engine([str(model_dir)], options), options).translate(
        lines, guides=guides)
    assert all(h["text"].startswith("a b") for h in answer["nbest"][1])
    assert all(f" {p} " in f" {answer['translations'][i]} " for i in (0, 3) for p in constraints[i])


def test_concurrent_requests_share_batches_and_never_mix(model_dir):
    with start_app([str(model_dir)], TranslateOptions(**CPU), window_s=0.3) as client:
        check_concurrent_requests(client, model_dir)


def check_concurrent_requests(client, model_dir) -> None:
    before = client.get("/health").json()
    jobs = [sources(1 + k % 4, 100 + k) for k in range(8)]
    answers = concurrently(client, [{"texts": job} for job in jobs])
    everything = expected([str(model_dir)], [line for job in jobs for line in job])
    start_line = 0
    for job, answer in zip(jobs, answers):
        assert answer.status_code == 200
        assert answer.json()["translations"] == everything[start_line:start_line + len(job)]
        start_line += len(job)
    after = client.get("/health").json()
    assert after["requests"] - before["requests"] == len(jobs)
    assert after["lines"] - before["lines"] == sum(map(len, jobs))
    assert after["batches"] - before["batches"] < len(jobs)  # some requests shared a model call
    assert after["largest_batch_requests"] >= 2



@pytest.fixture(scope="module")
def tagged_dir(tmp_path_factory) -> Path:
    """A multilingual model: <2r> reverses, <2c> copies (tests/conftest.py)."""
    return tagged_model(tmp_path_factory.mktemp("tagged"), steps=250)


def test_requests_for_different_target_languages_never_mix(tagged_dir):
    """Requests for r and c (and one with the server's --target-lang c) arriving in one
    window: each language gets one model call of its own, and every answer is translate
    --target-lang's for its language."""
    lines, model = sequences(6, 31, length=4), [str(tagged_dir)]
    languages = ["r", "c", "r", None]  # None: the server's default
    with start_app(model, TranslateOptions(**CPU, target_lang="c"), window_s=1.0) as client:
        before = client.get("/health").json()
        answers = concurrently(client, [{"texts": lines, **({"target_lang": lang} if lang else {})}
                                        for lang in languages])
        after = client.get("/health").json()
        card = client.get("/info").json()
        table = client.get("/info", params={"format": "text"}).text
        refused = client.post("/translate", json={"texts": lines, "target_lang": "fr"})
    reference = {lang: expected(model, lines, target_lang=lang) for lang in ("r", "c")}
    assert sum(r != c for r, c in zip(reference["r"], reference["c"])) >= 4  # the language decides (6 of 6)
    for lang, answer in zip(languages, answers):
        assert answer.status_code == 200 and answer.json()["translations"] == reference[lang or "c"]
    assert after["requests"] - before["requests"] == 4
    assert after["batches"] - before["batches"] == 2 and after["largest_batch_requests"] == 2
    assert card["target_languages"] == ["r", "c"] and card["serving"]["defaults"]["target_lang"] == "c"
    assert re.search(r"target languages\s+│\s+r, c \(--target-lang\)", table), table
    assert refused.status_code == 400 and refused.json() == {
        "error": "target_lang fr: the model has no target-language tag <2fr> (its target languages: r, c)"}


def test_serve_refuses_a_target_lang_the_model_lacks_like_translate(tagged_dir, model_dir, monkeypatch, capsys):
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(tagged_dir), "--port", "0",
                                  "--target-lang", "fr")
    assert (code, err) == (2, "nmtkit: error: --target-lang fr: the model has no target-language tag <2fr> "
                              "(its target languages: r, c)\n")
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(model_dir), "--port", "0",
                                  "--target-lang", "es")
    assert (code, err) == (2, "nmtkit: error: --target-lang es: the model has no target-language tag <2es> "
                              "(it has none: a model of one direction)\n")

# --- the server's defaults: resolved as translate resolves its flags --------------------------

SAVED = {"beam_size": 3, "lenpen": 1.0, "max_len_a": 0.0, "max_len_b": 3, "min_len": 0, "batch_tokens": 700,
         "eos_at_limit": "free"}


@pytest.fixture(scope="module")
def saved_dir(model_dir, tmp_path_factory) -> Path:
    """model_dir's weights saved with decode settings of their own (SAVED), as a recipe's
    decode section leaves them."""
    from nmtkit.modeldir import load_model_dir, save_model_dir

    loaded = load_model_dir(model_dir)
    spm = model_dir / loaded.meta["spm"]["src"]
    return save_model_dir(loaded.model, loaded.model_cfg, tmp_path_factory.mktemp("saved") / "model", spm, spm,
                          {"decode": SAVED})


def options_of(monkeypatch, capsys, command: str, *args: str) -> TranslateOptions:
    """The options ``nmtkit COMMAND ARGS`` (serve or translate) runs under, caught where the
    command hands them to its core function (so no server starts and nothing is translated)."""
    import nmtkit.serving.app
    import nmtkit.translate_files

    caught = {}
    with monkeypatch.context() as patch:
        patch.setattr(nmtkit.serving.app, "serve", lambda dirs, options, *rest, **kw: caught.update(options=options))
        patch.setattr(nmtkit.translate_files, "translate_file",
                      lambda dirs, source, out, options, *rest: caught.update(options=options))
        code, _, err = cli_in_process(patch, capsys, command, *args)
    assert code == 0, err
    return caught["options"]


def decode_of(options: TranslateOptions) -> dict:
    return {name: getattr(options, name) for name in SAVED}


def translated(monkeypatch, capsys, *args: str) -> str:
    """What ``nmtkit translate ARGS`` writes to stdout."""
    code, out, err = cli_in_process(monkeypatch, capsys, "-q", "translate", "--device", "cpu", *args)
    assert code == 0, err
    return out


def served(options: TranslateOptions, model_dirs: list[str], body: dict) -> tuple[str, dict]:
    """The answer's translations as translate writes them (a line each), and the /info card."""
    with start_app(model_dirs, options) as client:
        answer = client.post("/translate", json=body)
        assert answer.status_code == 200, answer.text
        return "".join(text + "\n" for text in answer.json()["translations"]), client.get("/info").json()


def test_serve_defaults_are_the_models_saved_settings_unless_a_flag_overrides(saved_dir, model_dir, tmp_path,
                                                                              monkeypatch, capsys):
    lines = sources(6, 7)
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines))
    model, flags = [str(saved_dir)], ["--beam-size", "1", "--max-len-b", "9"]
    options = options_of(monkeypatch, capsys, "serve", "-m", model[0], "--port", "0", "--device", "cpu")
    assert decode_of(options) == SAVED
    answer, card = served(options, model, {"texts": lines})
    assert answer == translated(monkeypatch, capsys, "-m", model[0], "-i", str(source))
    assert answer != translated(monkeypatch, capsys, "-m", str(model_dir), "-i", str(source))  # the settings count
    assert {**card["serving"]["defaults"], "batch_tokens": card["serving"]["batch_tokens"]} == {
        **SAVED, "nbest": 1, "scores": False, "alignments": False, "alignment_units": "words", "target_lang": ""}
    asked, _ = served(options, model, {"texts": lines, "beam_size": 2})  # a request's setting over the server's
    assert asked == translated(monkeypatch, capsys, "-m", model[0], "-i", str(source), "--beam-size", "2")
    flagged = options_of(monkeypatch, capsys, "serve", "-m", model[0], "--port", "0", "--device", "cpu", *flags)
    assert decode_of(flagged) == {**SAVED, "beam_size": 1, "max_len_b": 9}
    answer, card = served(flagged, model, {"texts": lines})
    assert answer == translated(monkeypatch, capsys, "-m", model[0], "-i", str(source), *flags)
    assert (card["serving"]["defaults"]["beam_size"], card["serving"]["defaults"]["max_len_b"]) == (1, 9)


def test_serve_resolves_ensembles_and_exports_as_translate(saved_dir, model_dir, tmp_path, monkeypatch, capsys):
    from nmtkit.config import DecodeConfig

    models = [("-m", str(saved_dir), "-m", str(model_dir)), ("-m", str(model_dir), "-m", str(saved_dir))]
    if importlib.util.find_spec("ctranslate2"):
        from nmtkit.ctranslate2.export import export_ctranslate2

        models.append(("-m", str(export_ctranslate2(saved_dir, tmp_path / "ct2"))))
    for args, decode in zip(models, [SAVED, DecodeConfig().__dict__, SAVED]):  # an ensemble: the first model's
        assert decode_of(options_of(monkeypatch, capsys, "serve", *args, "--port", "0")) == decode
        assert decode_of(options_of(monkeypatch, capsys, "translate", *args)) == decode
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(saved_dir), "--port", "0", "--max-beam", "2")
    assert (code, err) == (2, "nmtkit: error: the server's beam size 3 (--beam-size, else the model's decode "
                              "settings) is over --max-beam 2: give a smaller --beam-size or a larger --max-beam\n")
    # a default outside what a request may ask for (max_len_b is at most 1024 in a request)
    code, _, err = cli_in_process(monkeypatch, capsys, "serve", "-m", str(saved_dir), "--port", "0", "--max-len-b", "2000")
    assert (code, err) == (2, "nmtkit: error: the server's --max-len-b 2000 (--max-len-b, else the model's decode "
                              "settings) is outside [0, 1024], the range a request may ask for: give a --max-len-b "
                              "within it\n")


MALFORMED = {
    "not JSON": (b'{"texts": ["a b"', 400, "not JSON"),
    "invalid UTF-8": (b'{"texts": ["a \xff b"]}', 400, "UTF-8"),
    "lone surrogate": (b'{"texts": ["a \\ud800"]}', 400, "surrogate"),
    "not an object": (b'["a b"]', 400, "JSON object"),
    "texts not a list": (b'{"texts": "a b"}', 400, "list of strings"),
    "a text not a string": (b'{"texts": ["a", 3]}', 400, "list of strings"),
    "texts missing": (b'{"beam_size": 2}', 400, "list of strings"),
    "nested too deeply": (b'{"x": ' + b"[" * 1800 + b"]" * 1800 + b"}", 400, "nested too deeply"),
    "oversized body": (json.dumps({"texts": ["a b"] * 1000}).encode(), 413, "at most 4000"),
    "too many lines": (json.dumps({"texts": ["a b"] * 7}).encode(), 413, "at most 6"),
    "too long a line": (json.dumps({"texts": ["a " * 31]}).encode(), 413, "at most 60"),
    "a line break": (json.dumps({"texts": ["a\nb"]}).encode(), 400, "line break"),
    "unknown option": (json.dumps({"texts": ["a"], "beam": 2}).encode(), 400, "unknown field(s) 'beam'"),
    "a key given twice": (b'{"texts": ["a"], "beam_size": 1, "beam_size": 4}', 400,
                          "body repeats the key 'beam_size': give each field once"),
    "beam too large": (json.dumps({"texts": ["a"], "beam_size": 5}).encode(), 400, "between 1 and 4"),
    "beam zero": (json.dumps({"texts": ["a"], "beam_size": 0}).encode(), 400, "between 1 and 4"),
    "beam as a string": (json.dumps({"texts": ["a"], "beam_size": "2"}).encode(), 400, "integer"),
    "beam as a float": (json.dumps({"texts": ["a"], "beam_size": 2.5}).encode(), 400, "integer"),
    "beam as a bool": (json.dumps({"texts": ["a"], "beam_size": True}).encode(), 400, "integer"),
    "lenpen NaN": (b'{"texts": ["a"], "lenpen": NaN}', 400, "between"),
    "lenpen negative": (json.dumps({"texts": ["a"], "lenpen": -1}).encode(), 400, "between"),
    "scores as 1": (json.dumps({"texts": ["a"], "scores": 1}).encode(), 400, "true or false"),
    "nbest over beam": (json.dumps({"texts": ["a"], "nbest": 3, "beam_size": 2}).encode(), 400, "beam_size >= 3"),
    "prefixes not one per text": (json.dumps({"texts": ["a"], "prefixes": ["a", "b"]}).encode(), 400, "one per text"),
    "a prefix with a line break": (json.dumps({"texts": ["a"], "prefixes": ["a\nb"]}).encode(), 400,
                                   "prefixes[0] holds a line break"),
    "a phrase not a string": (json.dumps({"texts": ["a"], "constraints": [[1]]}).encode(), 400,
                              "a list of strings per text"),
    "constraints not per text": (json.dumps({"texts": ["a"], "constraints": ["a"]}).encode(), 400,
                                 "a list of strings per text"),
    "an empty phrase": (json.dumps({"texts": ["a"], "constraints": [[" "]]}).encode(), 400, "empty phrase"),
    "too many phrases": (json.dumps({"texts": ["a"], "constraints": [["a"] * 33]}).encode(), 413, "at most 32"),
    "alignment_units without alignments": (json.dumps({"texts": ["a b c"], "alignment_units": "pieces"}).encode(),
                                           400, 'alignment_units applies to "alignments": true only'),
    "target_lang not a string": (json.dumps({"texts": ["a"], "target_lang": 3}).encode(), 400,
                                 'target_lang must be a string such as "es"'),
    "target_lang not a language": (json.dumps({"texts": ["a"], "target_lang": "e s"}).encode(), 400,
                                   "target_lang must be a language code such as es or pt_BR, not 'e s'"),
    "target_lang of a one-direction model": (json.dumps({"texts": ["a"], "target_lang": "es"}).encode(), 400,
                                             "target_lang es: the model has no target-language tag <2es> "
                                             "(it has none: a model of one direction)"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_every_malformed_request_is_a_4xx_json_error(client, case):
    body, status, fragment = MALFORMED[case]
    answer = client.post("/translate", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    assert fragment in answer.json()["error"] and "\n" not in answer.json()["error"]
    assert client.post("/translate", json={"texts": ["a b"]}).status_code == 200  # the server goes on


def test_body_without_length_is_cut_at_the_limit_and_other_routes_answer_json(client):
    chunks = (b"x" * 1000 for _ in range(10))  # chunked: no content-length to refuse early
    answer = client.post("/translate", content=chunks)
    assert answer.status_code == 413 and "over 4000 bytes" in answer.json()["error"]
    assert client.get("/translate").status_code == 405 and "error" in client.get("/translate").json()
    assert client.get("/nowhere").status_code == 404 and "error" in client.get("/nowhere").json()
    assert client.get("/info", params={"format": "xml"}).status_code == 400


def test_info_is_the_model_card_as_json_or_text(client, model_dir):
    from nmtkit.card import model_card

    card = client.get("/info").json()
    serving = card.pop("serving")
    assert card == json.loads(json.dumps(model_card(model_dir)))
    assert serving["engine"] == "torch" and serving["limits"]["max_lines"] == 6
    assert serving["running"] == "on cpu in float32"  # the engine's own words: device and dtype
    assert card["target_languages"] == [] and serving["defaults"]["target_lang"] == ""
    text = client.get("/info", params={"format": "text"})
    assert text.headers["content-type"].startswith("text/plain")
    assert "model card" in text.text and "transformer: d 32" in text.text and "serving engine: torch" in text.text


def test_info_says_which_dtype_runs_where_auto_was_asked(model_dir):
    options = TranslateOptions(**{**CPU, "dtype": "auto"})
    resolved = open_engine([str(model_dir)], options).description
    with start_app([str(model_dir)], options) as auto_client:
        serving = auto_client.get("/info").json()["serving"]
        text = auto_client.get("/info", params={"format": "text"}).text
    assert serving["dtype"] == "auto" and serving["running"] == resolved
    assert resolved.startswith("on cpu in ") and resolved.split(" in ")[1] in ("float32", "bfloat16")
    assert f"serving running: {resolved}\n" in text


def test_ctranslate2_engine_answers_like_translate(model_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.export import export_ctranslate2

    export = str(export_ctranslate2(model_dir, tmp_path / "ct2"))
    lines = sources(4, 3)
    options = TranslateOptions(**CPU, engine="ctranslate2")
    with start_app([export], options) as ct2_client:
        answer = ct2_client.post("/translate", json={"texts": lines, "scores": True, "beam_size": 2}).json()
        card = ct2_client.get("/info").json()
        prefixed = ct2_client.post("/translate", json={"texts": lines, "prefixes": ["b a"] * 4}).json()
        refused = ct2_client.post("/translate", json={"texts": lines, "constraints": [["a"]] * 4})
    assert all(text.startswith("b a") for text in prefixed["translations"])
    assert refused.status_code == 400 and "CTranslate2 has no lexically constrained search" in refused.json()["error"]
    reference = [row.split("\t") for row in expected([export], lines, engine="ctranslate2", scores=True, beam_size=2)]
    assert answer["translations"] == [text for _, text in reference]
    assert [f"{score:.4f}" for score in answer["scores"]] == [score for score, _ in reference]
    assert card["export"]["format"] == "ctranslate2" and card["serving"]["engine"] == "ctranslate2"


def post(port: int, payload: dict, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/translate", data=json.dumps(payload).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def start_server(model_dir: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """``nmtkit serve --port 0`` as a user runs it; returns the process and its port."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "nmtkit", "serve", "-m", str(model_dir), "--port", "0", *args],
                              stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    said = []
    for raw in server.stderr:  # the first line that names the address (warnings may come first)
        said.append(raw.decode())
        match = re.search(r"http://127\.0\.0\.1:(\d+)", said[-1])
        if match:
            return server, int(match.group(1))
    raise AssertionError("".join(said))


def test_sigterm_finishes_the_request_in_flight_then_exits(model_dir):
    lines = sources(3, 9)
    server, port = start_server(model_dir, "--batch-window-ms", "1500")  # a lone request waits 1.5 s
    try:
        # a client that sends half a body and leaves, and one that leaves before its answer
        with socket.create_connection(("127.0.0.1", port)) as half:
            half.sendall(b"POST /translate HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{\"texts\": [")
        with socket.create_connection(("127.0.0.1", port)) as impatient:
            body = json.dumps({"texts": lines}).encode()
            impatient.sendall(b"POST /translate HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        result: dict = {}
        in_flight = threading.Thread(target=lambda: result.update(answer=post(port, {"texts": lines})))
        in_flight.start()
        time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        in_flight.join(60)
        assert server.wait(60) == 0, server.stderr.read().decode()
    finally:
        server.kill()
    status, body = result["answer"]
    cli = run_cli("translate", "-m", str(model_dir), "--device", "cpu", input="".join(s + "\n" for s in lines))
    assert status == 200 and body["translations"] == cli.stdout.decode().splitlines()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_serve_refuses_bad_settings_in_one_line(model_dir):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        busy = run_cli("serve", "-m", str(model_dir), "--port", str(taken.getsockname()[1]))
    finally:
        taken.close()
    assert busy.returncode == 1 and busy.stderr.decode().startswith("nmtkit: error: cannot listen on 127.0.0.1:")
    bad = run_cli("serve", "-m", str(model_dir), "--max-lines", "0")
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1
    host = run_cli("serve", "-m", str(model_dir), "--host", "a..b")  # IDNA refuses the empty label
    assert host.returncode == 1 and host.stderr.decode().count("\n") == 1
    assert host.stderr.decode().startswith("nmtkit: error: cannot listen on a..b:") and "host name" in host.stderr.decode()


def test_missing_http_libraries_are_a_one_line_error(monkeypatch):
    from nmtkit.errors import NmtkitError
    from nmtkit.serving import require_http_stack

    require_http_stack()
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now raises ImportError
    with pytest.raises(NmtkitError, match=r"pip install 'nmtkit\[serve\]'"):
        require_http_stack()


def test_load_benchmark_runs_small_and_holds_off_slow_uploads_and_over_cost_requests(model_dir, tmp_path):
    """benchmarks/serve_load.py end to end with 2 clients x 3 requests, twice: the second time
    beside one slow uploader (cut with 408) and one over-cost client (every request a 413)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import serve_load

    source = tmp_path / "input.txt"
    source.write_text("".join(line + "\n" for line in sources(12, 4)), encoding="utf-8")
    record = serve_load.main(["--model", str(model_dir), "--input", str(source), "--clients", "2", "--requests", "3",
                              "--max-lines", "3", "--threads", "1", "--out", str(tmp_path / "out"),
                              "--adversaries", "1", "--read-timeout", "1", "--drip-s", "0.2"])
    assert record["ok"] and record["answered"] == 6 and record["wrong"] == 0 and record["malformed_refused"] == "8/8"
    assert record["p50_ms"] <= record["p99_ms"] and record["lines_s"] > 0
    assert json.loads((tmp_path / "out" / "serve_load.json").read_text())["records"][0]["ok"] is True
    assert record["adversaries_held"] and record["attacked_answered"] == 6 and record["attacked_wrong"] == 0
    assert record["slow_uploads_cut"] >= 1 and record["slow_uploads_not_cut"] == 0
    assert record["costly_refused"] >= 1 and record["costly_not_refused"] == 0
    assert record["rejected"]["search_memory"] == record["costly_refused"]
    assert record["rejected"]["read_timeout"] == record["slow_uploads_cut"]
