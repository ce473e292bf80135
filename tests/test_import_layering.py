"""The import rule of ARCHITECTURE.md, enforced: every ``nmtkit`` import (at module level or
inside a function) points to a lower layer or stays inside its own package, and no chain of
imports comes back to where it started."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nmtkit"

# lowest first; a unit is a top-level module or package of nmtkit ("" is nmtkit/__init__.py)
LAYERS = (
    ("", "errors", "specials", "workdir"),
    ("limits", "recipe_text"),
    ("storage", "runtime"),
    ("config", "runlog"),
    ("data", "models", "scoring"),
    ("modeldir",),
    ("decoding",),
    ("training", "ctranslate2"),
    ("viz", "card", "translate_files", "pipeline", "sweep"),
    ("serving",),
    ("cli_options",),
    ("cli",),
    ("__main__",),
)
LAYER_OF = {unit: number for number, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The nmtkit modules ``path`` imports, anywhere in it (``from pkg import submodule``
    counts as the submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "nmtkit")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "nmtkit":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, known) - {name} for name, path in known.items()}


def test_every_module_has_a_layer():
    assert sorted({unit(name) for name in modules()} - set(LAYER_OF)) == []


def test_imports_point_down_or_stay_in_their_package():
    upward = [f"{source} -> {target}" for source, targets in import_graph().items() for target in targets
              if unit(source) != unit(target) and LAYER_OF[unit(target)] >= LAYER_OF[unit(source)]]
    assert upward == []


def test_no_import_cycle():
    graph = import_graph()
    done: set[str] = set()
    cycles = []

    def visit(trail: list[str]) -> None:  # depth first; ``trail`` is the chain of imports being followed
        for target in sorted(graph.get(trail[-1], ())):
            if target in trail:
                cycles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in done:
                visit(trail + [target])
        done.add(trail[-1])

    for name in sorted(graph):
        if name not in done:
            visit([name])
    assert cycles == []


def test_the_checker_sees_lazy_imports_and_submodules(tmp_path):
    """The walk finds imports inside functions, and ``from package import module`` as the module."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from nmtkit.data.sources import files\n    from nmtkit.errors import DataError\n")
    assert imported(source, modules()) == {"nmtkit.data.sources.files", "nmtkit.errors"}
