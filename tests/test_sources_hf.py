"""The ``hf`` source on local datasets: save_to_disk and parquet load through the same path.

Nothing here touches the network: the Hub is unreachable from the test machines, and the
Hub error path is checked through the CLI with HF_HUB_OFFLINE set (test_prepare_cli.py).
"""
import pytest

from nmtkit.config import DataConfig
from nmtkit.data.sources import hf, read_corpus
from nmtkit.errors import ConfigError, DataError

datasets = pytest.importorskip("datasets")

ROWS = {
    "train": [("Hello", "Hallo"), ("Good morning", "Guten Morgen"), ("Thank you", "Danke")],
    "validation": [("Yes", "Ja")],
    "test": [("No", "Nein"), ("Maybe", None)],  # a missing text reads as empty
}


def dataset_dict():
    return datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"translation": [{"en": en, "de": de} for en, de in rows]})
        for split, rows in ROWS.items()
    })


@pytest.fixture(autouse=True)
def local_cache(tmp_path, monkeypatch):
    """Keep the arrow cache that parquet loading writes inside the test's directory."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.fixture(params=["save_to_disk", "parquet"])
def local_dataset(request, tmp_path):
    path = tmp_path / request.param
    if request.param == "save_to_disk":
        dataset_dict().save_to_disk(str(path))
    else:
        (path / "de-en").mkdir(parents=True)  # a config subdirectory, like the Hub's parquet layout
        for split, dataset in dataset_dict().items():
            dataset.to_parquet(str(path / "de-en" / f"{split}-00000-of-00001.parquet"))
    return path


def config(path, **kwargs):
    """The dataset's own configuration: the parquet layout's de-en subdirectory, none for save_to_disk."""
    named = "de-en" if (path / "de-en").is_dir() else ""
    return DataConfig(**{"source": "hf", "src_lang": "en", "tgt_lang": "de", "hf_name": str(path), "hf_config": named,
                         **kwargs})


def test_local_dataset_reads_all_splits(local_dataset):
    corpus = read_corpus(config(local_dataset))
    assert list(corpus.train) == ROWS["train"]
    assert corpus.dev == ROWS["validation"]
    assert corpus.test == [("No", "Nein"), ("Maybe", "")]
    assert corpus.train_size == 3
    assert corpus.provenance["rows"] == {"train": 3, "dev": 1, "test": 2}
    assert corpus.provenance["splits"] == {"train": "train", "dev": "validation", "test": "test"}


def test_reverse_direction_and_split_mapping(local_dataset):
    swapped = {"train": "train", "dev": "test", "test": "validation"}
    assert read_corpus(config(local_dataset, hf_splits=swapped)).test == ROWS["validation"]
    data = config(local_dataset)
    data.src_lang, data.tgt_lang = "de", "en"
    assert read_corpus(data).dev == [("Ja", "Yes")]


def test_fingerprint_names_local_files(local_dataset):
    files = hf.fingerprint(config(local_dataset))["files"]
    assert files and all(len(entry) == 3 for entry in files)  # relative path, size, mtime


def test_missing_split(local_dataset):
    data = config(local_dataset, hf_splits={"train": "train", "dev": "dev", "test": "test"})
    with pytest.raises(DataError, match="has no split 'dev'.*train, validation, test"):
        read_corpus(data)


def test_missing_language(local_dataset):
    data = config(local_dataset)
    data.tgt_lang = "fr"
    with pytest.raises(DataError, match="no language 'fr'.*en, de"):
        read_corpus(data)


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="dataset directory not found"):
        read_corpus(config(tmp_path / "nope"))


def test_directory_without_dataset(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "readme.txt").write_text("hi")
    with pytest.raises(DataError, match="neither a saved dataset"):
        read_corpus(config(tmp_path / "junk"))


def test_no_name_is_a_config_error():
    with pytest.raises(ConfigError, match="data.hf_name"):
        read_corpus(DataConfig(source="hf"))


def test_a_configuration_the_local_directory_lacks_is_refused(local_dataset):
    """A local dataset's configurations are its subdirectories: one it does not have would be read
    as the whole directory and recorded as if chosen."""
    with pytest.raises(ConfigError, match="data.hf_config 'fr-de': the local directory .* has no subdirectory"):
        read_corpus(config(local_dataset, hf_config="fr-de"))


def test_a_revision_for_a_local_directory_is_refused(local_dataset):
    with pytest.raises(ConfigError, match="data.hf_revision pins a Hub dataset's version; .* remove data.hf_revision"):
        read_corpus(config(local_dataset, hf_revision="v1.0"))


def _damaged_dict_json(path):
    dataset_dict().save_to_disk(str(path))
    (path / "dataset_dict.json").write_text('{"splits": 5}')


def _damaged_state_json(path):
    dataset_dict().save_to_disk(str(path))
    (path / "train" / "state.json").write_text('{"a": 1}')


def _empty_validation(path):
    datasets.DatasetDict({"train": dataset_dict()["train"], "validation": dataset_dict()["validation"].select([]),
                          "test": dataset_dict()["test"]}).save_to_disk(str(path))


def _mixed_schemas(path):
    path.mkdir()
    dataset_dict()["train"].to_parquet(str(path / "train-0.parquet"))
    datasets.Dataset.from_dict({"translation": [{"fr": "a", "en": "b"}], "x": [1]}).to_parquet(
        str(path / "train-1.parquet"))


@pytest.mark.parametrize("damage, message", [
    (_damaged_dict_json, "TypeError: 'int' object is not iterable"),
    (_damaged_state_json, "KeyError: '_data_files'"),
    (_empty_validation, "IndexError: list index out of range"),
    (_mixed_schemas, "DatasetGenerationError: An error occurred while generating the dataset: "),
])
def test_any_load_failure_is_one_line_data_error(tmp_path, damage, message):
    """``datasets`` raises all kinds of errors on a damaged local dataset; each is reported, not a traceback."""
    damage(tmp_path / "ds")
    with pytest.raises(DataError) as err:
        read_corpus(config(tmp_path / "ds"))
    assert str(err.value).startswith(f"cannot load dataset {tmp_path / 'ds'}: {message}")
    assert "\n" not in str(err.value)


def _parquet_configs(path):
    for name in ("de-en", "fr-en"):
        (path / name).mkdir(parents=True)
        for split, dataset in dataset_dict().items():
            dataset.to_parquet(str(path / name / f"{split}-00000-of-00001.parquet"))


def test_parquet_in_several_subdirectories_needs_a_configuration(tmp_path):
    """Parquet loading reads subdirectories recursively: without hf_config both would be merged."""
    _parquet_configs(tmp_path / "ds")
    with pytest.raises(ConfigError) as err:
        read_corpus(config(tmp_path / "ds", hf_config=""))
    assert str(err.value) == (f"{tmp_path / 'ds'} holds parquet files in several subdirectories (de-en, fr-en), "
                              f"which would be merged: set data.hf_config to the one to read")
    assert read_corpus(config(tmp_path / "ds", hf_config="fr-en")).train_size == 3


def test_a_parquet_file_is_not_a_dataset_directory(tmp_path):
    dataset_dict()["train"].to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(DataError, match=r"train.parquet \(data.hf_name\) is a file; data.hf_name must be a dataset "
                                        r"directory"):
        read_corpus(config(tmp_path / "train.parquet"))


def test_a_zero_is_reported_as_zero(tmp_path):
    rows = [{"en": 0, "de": 1}]
    datasets.DatasetDict({split: datasets.Dataset.from_dict({"translation": rows}) for split in ROWS}).save_to_disk(
        str(tmp_path / "ds"))
    with pytest.raises(DataError, match=r"a translation row holds \(0, 1\), not text"):
        list(read_corpus(config(tmp_path / "ds")).train)


def test_a_text_translation_column_is_refused_by_what_it_holds(tmp_path):
    text = datasets.Dataset.from_dict({"translation": ["Hello"]})
    datasets.DatasetDict({split: text for split in ROWS}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DataError, match=r"split train: the translation column holds string, not \{language: text\} "
                                        r"rows$"):
        read_corpus(config(tmp_path / "ds"))
