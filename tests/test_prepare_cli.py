"""``nmtkit prepare`` through the real command line: success, and one clean line per user error."""
import json
import subprocess
from pathlib import Path

import pytest

from nmtkit.data.sources import sword
from support.cli import run_cli


def write_files(root, lines=40):
    files = {}
    for split, count in (("train", lines), ("dev", 5), ("test", 5)):
        files[split] = {}
        for lang, word in (("en", "house"), ("es", "casa")):
            path = root / f"{split}.{lang}"
            path.write_text("".join(f"the {word} number {split} {i}\n" for i in range(count)), encoding="utf-8")
            files[split][lang] = str(path)
    return files


def write_recipe(root, data, **sections):
    path = root / "recipe.yaml"
    path.write_text(json.dumps({"name": "cli", "workdir": str(root / "work"), "data": data,
                                "vocab": {"size": 30}, **sections}))
    return path


def prepare(recipe, *overrides) -> subprocess.CompletedProcess:
    result = run_cli("prepare", str(recipe), *overrides)
    result.stderr = result.stderr.decode("utf-8")
    return result


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmtkit: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_prepare_from_files(tmp_path):
    recipe = write_recipe(tmp_path, {"source": "files", "files": write_files(tmp_path)})
    result = prepare(recipe)
    assert result.returncode == 0, result.stderr
    assert "fetch done, spm done, encode done" in result.stderr
    manifest = json.loads((tmp_path / "work" / "prepared" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["pairs"] == 40 and manifest["vocab"]["size"]["src"] == 30
    assert prepare(recipe).stderr.count("up to date") == 3


@pytest.mark.parametrize("problem, fragments", [
    ("missing", ["file not found", "dev.es"]),
    ("empty", ["file is empty", "test.en"]),
    ("mismatch", ["train.en has 40 lines but", "train.es has 39"]),
    ("utf8", ["train.es: line 3 is not valid UTF-8"]),
])
def test_files_errors(tmp_path, problem, fragments):
    files = write_files(tmp_path)
    if problem == "missing":
        (tmp_path / "dev.es").unlink()
    elif problem == "empty":
        (tmp_path / "test.en").write_text("")
    elif problem == "mismatch":
        (tmp_path / "train.es").write_text("".join(f"casa {i}\n" for i in range(39)))
    else:
        (tmp_path / "train.es").write_bytes(b"casa\ncasa\ncasa \xe9\n" + b"casa\n" * 37)
    assert_one_line_error(prepare(write_recipe(tmp_path, {"source": "files", "files": files})), *fragments)


def test_a_corpus_inside_prepared_is_refused_and_left_alone(tmp_path):
    """prepare rewrites prepared/: the user's corpus kept there (workdir: . with their own
    prepared/train.en) would be deleted by its first run."""
    inside = tmp_path / "work" / "prepared"
    inside.mkdir(parents=True)
    files = write_files(inside)
    before = {path.name: path.read_bytes() for path in inside.iterdir()}
    assert_one_line_error(prepare(write_recipe(tmp_path, {"source": "files", "files": files})),
                          "data.files.train.en", "is inside", "keep the corpus outside it")
    assert {path.name: path.read_bytes() for path in inside.iterdir()} == before


def test_a_prepared_directory_nmtkit_did_not_make_is_refused(tmp_path):
    recipe = write_recipe(tmp_path, {"source": "files", "files": write_files(tmp_path)})
    prepared = tmp_path / "work" / "prepared"
    (prepared / "tmp_notes").mkdir(parents=True)
    (prepared / "tmp_notes" / "notes.txt").write_text("mine\n")
    (prepared / "dev.en").write_text("my own dev set\n")
    assert_one_line_error(prepare(recipe), f"{prepared} exists and nmtkit did not write it")
    assert (prepared / "tmp_notes" / "notes.txt").read_text() == "mine\n"
    assert (prepared / "dev.en").read_text() == "my own dev set\n"
    for path in (prepared / "tmp_notes" / "notes.txt", prepared / "dev.en", prepared / "tmp_notes"):
        path.unlink() if path.is_file() else path.rmdir()
    assert prepare(recipe).returncode == 0  # an empty prepared/ is taken as prepare's own


@pytest.mark.parametrize("left", [[".nmtkit.lock"], [".unfinished", ".train.npz.nmtkit-host-1-x.tmp"], ["train.npz"],
                                  ["stamps"], []])
def test_what_a_killed_or_older_prepare_left_is_taken_as_its_own(tmp_path, left):
    """Only its lock (killed before any step), a step's mark and temp file, an older nmtkit's id
    files or its stamps: prepare carries on there; one file of the user's beside its lock is not."""
    from nmtkit.config import DataConfig
    from nmtkit.data.ownership import check_prepared_dir
    from nmtkit.errors import ConfigError

    data = DataConfig(source="files", src_lang="en", tgt_lang="es", files=write_files(tmp_path))
    prepared = tmp_path / "work" / "prepared"
    prepared.mkdir(parents=True)
    for name in left:
        (prepared / name).write_bytes(b"")
    check_prepared_dir(data, prepared)
    (prepared / "notes.txt").write_text("mine\n")
    if not set(left) - {".nmtkit.lock"}:
        with pytest.raises(ConfigError, match="exists and nmtkit did not write it"):
            check_prepared_dir(data, prepared)


def test_compressed_files_prepare_as_their_text(tmp_path):
    """gzip, bzip2 and xz files, known by their first bytes whatever their names, give the same
    prepared data as the plain files."""
    import bz2
    import gzip
    import lzma

    plain = write_recipe(tmp_path, {"source": "files", "files": write_files(tmp_path)})
    assert prepare(plain).returncode == 0
    packed = tmp_path / "packed"
    packed.mkdir()
    files = write_files(packed)
    for (split, langs), compress in zip(files.items(), (gzip.compress, bz2.compress, lzma.compress)):
        for lang, path in langs.items():  # train as gzip, dev as bzip2, test as xz; the names kept
            Path(path).write_bytes(compress(Path(path).read_bytes()))
    assert prepare(write_recipe(packed, {"source": "files", "files": files})).returncode == 0
    for name in ("dev.en", "dev.es", "test.en", "test.es"):
        assert (packed / "work" / "prepared" / name).read_bytes() == (tmp_path / "work" / "prepared" / name).read_bytes()
    read = [json.loads((root / "work" / "prepared" / "manifest.json").read_text())["splits"] for root in (tmp_path, packed)]
    assert read[0] == read[1] and read[0]["train"]["pairs"] == 40


def test_a_damaged_compressed_file_is_a_one_line_error(tmp_path):
    import gzip

    files = write_files(tmp_path, lines=2000)
    train = Path(files["train"]["es"])
    train.write_bytes(gzip.compress(train.read_bytes())[:-200])  # cut short
    assert_one_line_error(prepare(write_recipe(tmp_path, {"source": "files", "files": files})),
                          str(train), "data.files.train.es", "a damaged gzip file")


def test_text_that_starts_like_bzip2_is_plain_and_an_empty_compressed_file_is_empty(tmp_path):
    """bzip2's "BZh" is plain ASCII: a corpus starting with it is text. A compressed file of
    nothing is as empty as a plain one, not a silently empty split."""
    import gzip

    files = write_files(tmp_path)
    for lang in ("en", "es"):
        path = Path(files["dev"][lang])
        path.write_text("BZh9 is not a header\n" + path.read_text())
    done = prepare(write_recipe(tmp_path, {"source": "files", "files": files}))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "work" / "prepared" / "dev.en").read_text().startswith("BZh9 is not a header\n")
    Path(files["test"]["es"]).write_bytes(gzip.compress(b""))
    assert_one_line_error(prepare(write_recipe(tmp_path, {"source": "files", "files": files})),
                          "file is empty", "data.files.test.es")


def test_vocab_too_large_for_the_data(tmp_path):
    recipe = write_recipe(tmp_path, {"source": "files", "files": write_files(tmp_path)})
    assert_one_line_error(prepare(recipe, "vocab.size=5000"), "SentencePiece training failed", "vocab.size")


def test_same_language_twice(tmp_path):
    recipe = write_recipe(tmp_path, {"source": "files", "files": write_files(tmp_path), "tgt_lang": "en"})
    assert_one_line_error(prepare(recipe), "must differ")


@pytest.mark.parametrize("name, fragments", [
    ("wmt/wmt14", ["cannot load dataset wmt/wmt14 (de-en)", "Hub"]),  # Hub unreachable
    ("./no/such/dir", ["dataset directory not found"]),
])
def test_hf_errors(tmp_path, monkeypatch, name, fragments):
    recipe = write_recipe(tmp_path, {"source": "hf", "hf_name": name, "hf_config": "de-en",
                                     "src_lang": "de", "tgt_lang": "en"})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # "unreachable" at once instead of half a minute of retries
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert_one_line_error(prepare(recipe), *fragments)


def test_sword_missing_module(tmp_path):
    (tmp_path / "sword" / "mods.d").mkdir(parents=True)
    recipe = write_recipe(tmp_path, {"source": "sword", "sword_path": str(tmp_path / "sword")})
    assert_one_line_error(prepare(recipe), "SWORD module engWEB2015eb not found", "sword-text-web")


def test_sword_module_misspelt(tmp_path):
    recipe = write_recipe(tmp_path, {"source": "sword", "sword_tgt": "spaRV1910"})
    if sword._conf_path(sword.Path("/usr/share/sword"), "engWEB2015eb") is None:
        pytest.skip("sword-text-web not installed")
    assert_one_line_error(prepare(recipe), "SWORD module spaRV1910 not found")
