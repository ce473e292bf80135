"""A sweep never replaces a user's files in its directory; a grid is sized before it is
expanded; a number past Python's int-string limit anywhere in a sweep or recipe is one line."""
from __future__ import annotations

import json

import pytest
import yaml

from support.cli import cli_in_process
from nmtkit.config import load_config
from nmtkit.errors import ConfigError
from nmtkit.sweep.spec import load_sweep
from support.sweeps import write_sweep, write_task

HUGE = "9" * 5000  # past Python's 4,300-digit limit for int <-> str


def one_line_error(code: int, err: str) -> str:
    assert code == 2 and err.startswith("nmtkit: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name", ["results.md", "results.json", "sweep.json", "variants/fast/sweep-run.json"])
def test_a_sweep_refuses_a_directory_holding_files_it_did_not_write(tmp_path, monkeypatch, capsys, name):
    write_task(tmp_path)
    sweep = write_sweep(tmp_path, "mine")
    mine = tmp_path / "mine" / name
    mine.parent.mkdir(parents=True)
    mine.write_text("my notes\n", encoding="utf-8")
    code, _, err = cli_in_process(monkeypatch, capsys, "sweep", str(sweep))
    one_line_error(code, err)
    assert f"{mine} exists and nmtkit did not write it" in err
    assert mine.read_text(encoding="utf-8") == "my notes\n"
    assert not (tmp_path / "mine" / "prepared").exists()  # refused before any work


def test_a_sweep_directory_of_its_own_is_recognised(tmp_path):
    from nmtkit.sweep.plan import refuse_foreign_files

    write_task(tmp_path)
    plan = load_sweep(write_sweep(tmp_path, "ours"))
    workdir = tmp_path / "ours"
    (workdir / "variants" / "fast").mkdir(parents=True)
    (workdir / "results.md").write_text("# Sweep ours\n\n| variant |\n", encoding="utf-8")
    (workdir / "results.json").write_text(json.dumps({"sweep": "ours", "variants": []}), encoding="utf-8")
    (workdir / "variants" / "fast" / "sweep-run.json").write_text(json.dumps({"config": "x", "status": "done"}))
    refuse_foreign_files(plan)  # all as nmtkit writes them: no error
    (workdir / "results.md").write_text("# My results\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="results.md exists and nmtkit did not write it"):
        refuse_foreign_files(plan)
    (workdir / "sweep.json").write_text(json.dumps({"sweep": "ours", "variants": [{"name": "baseline"}]}))
    refuse_foreign_files(plan)  # a directory with the sweep's plan is the sweep's, damaged files included


def test_a_grid_is_sized_before_it_is_expanded(tmp_path):
    write_task(tmp_path)
    grid = {f"train.k{i}": list(range(10)) for i in range(7)}  # 10**7 combinations, unknown keys
    path = write_sweep(tmp_path, "huge", variants=[{"name": "g", "grid": grid}])
    with pytest.raises(ConfigError, match="the grid has 10,000,000 combinations"):
        load_sweep(path)
    many = [{"name": f"v{i}", "grid": {"train.lr": [0.1 * k for k in range(1, 101)]}} for i in range(101)]
    with pytest.raises(ConfigError, match="more than 10,000 variants"):
        load_sweep(write_sweep(tmp_path, "many", variants=many))


def test_a_large_grid_reads_its_recipe_once_and_digests_each_variant_once(tmp_path, monkeypatch):
    """The table is rebuilt after every run and asks each variant's status: with the digest
    recomputed each time, a 1,000-variant grid cost O(N^2) digests (16 s to load and list)."""
    from nmtkit.sweep import record, spec

    write_task(tmp_path)
    calls = {"read_recipe": 0, "changed_settings": 0}

    def counted(name: str, original):
        def call(*args):
            calls[name] += 1
            return original(*args)
        return call

    for name in calls:
        monkeypatch.setattr(spec, name, counted(name, getattr(spec, name)))
    plan = load_sweep(write_sweep(tmp_path, "g", variants=[{"grid": {"train.lr": [0.001 * k for k in range(1, 21)],
                                                                     "train.seed": list(range(10))}}]))
    assert len(plan.variants) == 200 and calls == {"read_recipe": 1, "changed_settings": 200}
    for _ in range(3):  # as after each of three runs
        assert {record.variant_status(plan, v) for v in plan.variants} == {"pending"}
        assert len({(v.config_key, v.data_key) for v in plan.variants}) == 200
    assert calls == {"read_recipe": 1, "changed_settings": 200}


@pytest.mark.parametrize("where", ["grid value", "quoted grid value", "override", "variant override"])
def test_a_number_of_5000_digits_in_a_sweep_is_one_line(tmp_path, monkeypatch, capsys, where):
    write_task(tmp_path)
    path = tmp_path / "s.yaml"
    text = {"grid value": f"grid: {{train.max_steps: [{HUGE}]}}",
            "quoted grid value": f"grid: {{train.max_steps: ['{HUGE}']}}",
            "override": f"overrides: {{train.max_steps: {HUGE}}}\nvariants: [{{name: a}}]",
            "variant override": f"variants: [{{name: a, overrides: ['train.max_steps={HUGE}']}}]"}[where]
    path.write_text(f"recipe: base.yaml\nworkdir: {tmp_path / 'w'}\n{text}\n", encoding="utf-8")
    for dry_run in (["--dry-run"], []):
        code, _, err = cli_in_process(monkeypatch, capsys, "sweep", str(path), *dry_run)
        one_line_error(code, err)
        assert len(err) < 400  # the number is counted, not printed


@pytest.mark.parametrize("override", [f"train.max_steps={HUGE}", f"train.lr={HUGE}", f"name={HUGE}",
                                      f"train.max_steps=-{HUGE}"])
def test_a_number_of_5000_digits_in_a_recipe_override_is_a_config_error(tmp_path, override):
    recipe = write_task(tmp_path)
    with pytest.raises(ConfigError, match="5,000 digits"):
        load_config(recipe, [override])
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(yaml.safe_load(recipe.read_text())) + f"seed: {HUGE}\n")
    with pytest.raises(ConfigError, match="5,000 digits"):
        load_config(tmp_path / "r.yaml")
