"""tests/README.md's table maps every nmtkit module to its tests: a new module or test file
gets its row, and a renamed one cannot leave the table pointing nowhere."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "nmtkit"


def table_rows() -> list[tuple[list[str], list[str]]]:
    """(modules, test files) named in backticks in each row of the module table."""
    text = (TESTS / "README.md").read_text(encoding="utf-8")
    rows = []
    for line in text.split("## Each module and its tests", 1)[1].splitlines():
        cells = line.split("|")
        if len(cells) == 4 and not set(cells[1].strip()) <= {"-"} and cells[1].strip() != "module":
            rows.append((re.findall(r"`([^`]+)`", cells[1]), re.findall(r"`(test_\w+\.py)`", cells[2])))
    return rows


def test_every_module_has_a_row_and_every_test_file_is_named():
    rows = table_rows()
    named = [name for modules, _ in rows for name in modules]
    covered = lambda path: any(path == name or (name.endswith("/") and path.startswith(name)) for name in named)
    modules = [p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py")]
    assert [path for path in modules if not covered(path)] == []
    assert [name for name in named if name.endswith((".py", "/"))
            and not (PACKAGE / name).exists() and not (PACKAGE.parent / name).exists()] == []
    listed = {test for _, tests in rows for test in tests}
    assert sorted(listed - {p.name for p in TESTS.glob("test_*.py")}) == []  # no row names a missing file
    assert sorted({p.name for p in TESTS.glob("test_*.py")} - listed) == []  # every test file has a row


def test_the_table_parser_reads_modules_and_tests_of_a_row():
    rows = table_rows()
    assert (["training/ema.py"], ["test_ema.py"]) in rows
    assert any(modules == ["data/corpora.py", "data/mixing.py"] and tests == ["test_corpora.py"]
               for modules, tests in rows)
