"""nmtkit's command line, run as a user runs it (a subprocess) or in this process (fast), and
the checks that an error is exactly one ``nmtkit: error:`` line."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, input: str | bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m nmtkit ARGS`` the way a user would (text in, text out)."""
    if isinstance(input, str):
        input = input.encode("utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: threads only add overhead
    return subprocess.run([sys.executable, "-m", "nmtkit", *args], input=input, capture_output=True, cwd=cwd,
                          timeout=600, env=env)


def cli_here(*args) -> subprocess.CompletedProcess:
    """``nmtkit ARGS`` through ``nmtkit.cli.main`` in this process, returned as ``run_cli`` returns
    it but with str stdout and stderr: the same code as the command, less the interpreter's
    start-up. Its children get run_cli's environment; the environment is put back after."""
    from nmtkit.cli import main

    argv = ["nmtkit", *map(str, args)]
    out, err, environ = io.StringIO(), io.StringIO(), dict(os.environ)
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            patch.setenv("OMP_NUM_THREADS", "1")
            patch.setattr(sys, "argv", argv)
            with pytest.raises(SystemExit) as stopped:
                main()
    finally:
        os.environ.clear()
        os.environ.update(environ)
    code = stopped.value.code
    if isinstance(code, str):  # as the interpreter reports SystemExit("message")
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(argv, code or 0, out.getvalue(), err.getvalue())


def cli_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``nmtkit ARGS`` in this process, through ``nmtkit.cli.main`` (no interpreter start-up):
    (exit code, stdout, stderr)."""
    from nmtkit.cli import main

    monkeypatch.setattr(sys, "argv", ["nmtkit", *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    captured = capsys.readouterr()
    return stopped.value.code or 0, captured.out, captured.err


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """``nmtkit ARGS`` in this process: (exit code, stderr)."""
    code, _, err = cli_in_process(monkeypatch, capsys, *args)
    return code, err


def cli_stdout(monkeypatch, capsys, *args: str) -> str:
    """``nmtkit ARGS`` in this process, which must succeed: its stdout."""
    code, out, err = cli_in_process(monkeypatch, capsys, *args)
    assert code == 0, err
    return out


def assert_error(code: int, err: str, expected_code: int, *fragments: str) -> str:
    """The run failed with ``expected_code`` and ended in exactly one ``nmtkit: error:`` line."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("nmtkit: error: ")]
    assert len(errors) == 1 and err.rstrip("\n").endswith(errors[0]), err
    assert code == expected_code, err
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def assert_one_line(code: int, err: str, codes: tuple[int, ...], marker: Path) -> str:
    """Stricter than ``assert_error``: stderr is that one line and nothing else, and the damaged
    input's payload did not run (``marker`` is what a malicious pickle would create)."""
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("nmtkit: error: "), err
    assert code in codes, err
    assert not marker.exists()
    return err

