"""The ``files`` source: parallel text files per split, and every error a user can cause."""
import pytest

from nmtkit.config import DataConfig
from nmtkit.data.sources import files, read_corpus
from nmtkit.errors import ConfigError, DataError


def write_split(tmp_path, split, src_lines, tgt_lines):
    paths = {}
    for lang, lines in (("en", src_lines), ("es", tgt_lines)):
        path = tmp_path / f"{split}.{lang}"
        path.write_bytes(lines if isinstance(lines, bytes) else "".join(f"{line}\n" for line in lines).encode())
        paths[lang] = str(path)
    return paths


@pytest.fixture
def data(tmp_path):
    return DataConfig(source="files", files={
        "train": write_split(tmp_path, "train", ["one", "two", "three"], ["uno", "dos", "tres"]),
        "dev": write_split(tmp_path, "dev", ["four"], ["cuatro"]),
        "test": write_split(tmp_path, "test", ["five", ""], ["cinco", ""]),
    })


def test_reads_three_splits(data):
    corpus = read_corpus(data)
    assert list(corpus.train) == [("one", "uno"), ("two", "dos"), ("three", "tres")]
    assert corpus.dev == [("four", "cuatro")]
    assert corpus.test == [("five", "cinco"), ("", "")]  # dev/test kept line for line, empty or not
    assert corpus.provenance["files"]["dev"]["es"].endswith("dev.es")


def test_fingerprint_changes_with_the_file(data, tmp_path):
    before = files.fingerprint(data)
    (tmp_path / "train.en").write_text("one\ntwo\nthree!\n")
    assert files.fingerprint(data) != before


def test_missing_file(data, tmp_path):
    (tmp_path / "dev.es").unlink()
    with pytest.raises(DataError, match=r"file not found: .*dev\.es"):
        read_corpus(data)


def test_empty_file(data, tmp_path):
    (tmp_path / "test.en").write_text("")
    with pytest.raises(DataError, match=r"file is empty: .*test\.en"):
        read_corpus(data)


def test_old_mac_line_ends_are_refused_and_windows_ones_read(data, tmp_path):
    (tmp_path / "train.es").write_bytes(b"uno\rdos\rtres\r")
    with pytest.raises(DataError, match=r"train\.es \(data.files.train.es\) ends its lines with a carriage return alone"):
        read_corpus(data)
    (tmp_path / "train.es").write_bytes(b"uno\r\ndos\r\ntres\r\n")
    assert list(read_corpus(data).train) == [("one", "uno"), ("two", "dos"), ("three", "tres")]
    long_first = "x" * 200_000 + "\r y"  # a stray carriage return in a first line longer than one read
    (tmp_path / "train.es").write_bytes(f"{long_first}\ndos\ntres\n".encode())
    assert [tgt for _, tgt in read_corpus(data).train] == [long_first, "dos", "tres"]


def test_mismatched_dev_lines(data, tmp_path):
    (tmp_path / "dev.en").write_text("four\nextra\n")
    with pytest.raises(DataError, match=r"dev\.en has 2 lines but .*dev\.es has 1"):
        read_corpus(data)


@pytest.mark.parametrize("src, tgt, expected", [("a\nb\nc\nd\n", "x\ny\n", (4, 2)), ("a\n", "x\ny\nz\n", (1, 3))])
def test_mismatched_train_lines_found_while_streaming(data, tmp_path, src, tgt, expected):
    (tmp_path / "train.en").write_text(src)
    (tmp_path / "train.es").write_text(tgt)
    with pytest.raises(DataError, match=rf"train\.en has {expected[0]} lines but .*train\.es has {expected[1]}"):
        list(read_corpus(data).train)


def test_mismatched_train_lines_are_found_when_max_train_pairs_stops_reading_early(data, tmp_path):
    """A line lost near the end would stay hidden behind the cap (and misalign every pair after
    it): with a cap, the files are counted before reading."""
    import dataclasses

    capped = dataclasses.replace(data, max_train_pairs=3)
    (tmp_path / "train.en").write_text("".join(f"line {i}\n" for i in range(10)))
    (tmp_path / "train.es").write_text("".join(f"linea {i}\n" for i in range(10) if i != 8))
    with pytest.raises(DataError, match=r"train\.en has 10 lines but .*train\.es has 9"):
        read_corpus(capped)
    (tmp_path / "train.es").write_text("".join(f"linea {i}\n" for i in range(9)) + "linea 9")  # no final newline
    assert list(read_corpus(capped).train)[:3] == [(f"line {i}", f"linea {i}") for i in range(3)]


@pytest.mark.parametrize("split", ["train", "dev"])
def test_bad_utf8_names_file_and_line(data, tmp_path, split):
    (tmp_path / f"{split}.es").write_bytes(b"uno\ndos \xff\xfe\ntres\n" if split == "train" else b"ok\n\xc3(\n")
    (tmp_path / f"{split}.en").write_text("a\nb\nc\n" if split == "train" else "a\nb\n")
    with pytest.raises(DataError, match=rf"{split}\.es: line 2 is not valid UTF-8"):
        list(read_corpus(data).train)


def test_missing_split_or_language_is_a_config_error(data):
    del data.files["test"]
    with pytest.raises(ConfigError, match="data.files.test"):
        read_corpus(data)
    data.files["test"] = {"en": data.files["dev"]["en"]}
    with pytest.raises(ConfigError, match="data.files.test.es"):
        read_corpus(data)


def test_a_third_language_under_a_split_is_refused(data, tmp_path):
    """A key beside the two languages would be silently ignored, like a split nmtkit does not read."""
    data.files["train"]["fr"] = str(tmp_path / "train.en")
    with pytest.raises(ConfigError, match=r"data.files.train.fr: not a language of this corpus \(it reads en and es\)"):
        read_corpus(data)
    with pytest.raises(ConfigError, match="data.files.train.fr"):
        files.fingerprint(data)
