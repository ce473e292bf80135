"""What translate imports: only what translating needs. A shell user pays for every import on
each call, so scoring (sacrebleu), plotting, the serve stack and the optional peers must stay
out of the translate path, whether the line comes piped or from a file."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

NOT_FOR_TRANSLATE = ("sacrebleu", "datasets", "transformers", "matplotlib", "ctranslate2", "uvicorn", "fastapi",
                     "starlette", "pandas", "scipy", "sklearn", "comet", "yaml", "torch._dynamo", "torch._inductor")


def imported_modules(args: list[str], stdin: bytes) -> set[str]:
    """The modules ``python -X importtime -m nmtkit ARGS`` imports (its stderr lists each one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nmtkit", "-q", *args], input=stdin,
                          capture_output=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.count(b"\n") == 1
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", done.stderr.decode(), re.MULTILINE))


@pytest.mark.parametrize("way", ["piped", "file"])
def test_translate_imports_nothing_it_does_not_need(model_dir, tmp_path, way):
    source = tmp_path / "line.txt"
    source.write_bytes(b"the cat sat\n")
    args = ["translate", "-m", str(model_dir), "--device", "cpu", "-b", "2", "--max-len-b", "4"]
    modules = imported_modules([*args, "-i", str(source)] if way == "file" else args,
                               b"" if way == "file" else source.read_bytes())
    assert {"torch", "sentencepiece", "nmtkit.translate_files"} <= modules  # the measurement sees imports
    heavy = sorted(m for m in modules if m in NOT_FOR_TRANSLATE or m.split(".")[0] in NOT_FOR_TRANSLATE[:-2])
    assert heavy == []


@pytest.mark.parametrize("way", ["piped", "file"])
def test_translate_with_nothing_to_say_imports_no_rich(model_dir, tmp_path, way):
    """rich is imported for the first message on stderr; a translation with none to show (one
    thread asked for, so no note on the machine's load) never imports it."""
    source = tmp_path / "line.txt"
    source.write_bytes(b"the cat sat\n")
    args = ["translate", "-m", str(model_dir), "--device", "cpu", "-b", "2", "--max-len-b", "4", "--threads", "1"]
    modules = imported_modules([*args, "-i", str(source)] if way == "file" else args,
                               b"" if way == "file" else source.read_bytes())
    assert "nmtkit.runtime.console" in modules  # the console was made
    assert sorted(m for m in modules if m.split(".")[0] == "rich") == []


@pytest.mark.parametrize("way", ["piped", "file"])
def test_translating_a_ctranslate2_export_never_imports_torch(model_dir, tmp_path, way):
    """CTranslate2 runs without torch, so an export's first line does not wait for torch's import
    (over a second of a shell user's start-up); only --alignments, read from tensors, brings it in."""
    pytest.importorskip("ctranslate2")
    from nmtkit.ctranslate2.export import export_ctranslate2

    export = export_ctranslate2(model_dir, tmp_path / "ct2")
    source = tmp_path / "line.txt"
    source.write_bytes(b"the cat sat\n")
    args = ["translate", "-m", str(export), "--device", "cpu", "--max-len-b", "4"]
    modules = imported_modules([*args, "-i", str(source)] if way == "file" else args,
                               b"" if way == "file" else source.read_bytes())
    assert {"ctranslate2", "sentencepiece", "nmtkit.ctranslate2.engine"} <= modules
    assert sorted(m for m in modules if m.split(".")[0] in ("torch", "numpy")) == []  # numpy: 0.1 s more
    aligned = imported_modules([*args, "-i", str(source), "--alignments"], b"")
    assert "torch" in aligned
