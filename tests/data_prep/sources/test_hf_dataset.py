"""A Hugging Face datasets folder as documents: what save_to_disk writes (real `datasets`),
a folder of Arrow or Parquet shards, and the folders and columns refused up front."""

import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.errors import PrepareError
from data_prep.sources.document import SourceStats
from data_prep.sources.hf_dataset import HFDatasetSource

TEXTS = [f"row {i}: " + "words " * (i % 13) if i % 17 else ("" if i % 34 else None) for i in range(300)]


def _texts(source):
    stats = SourceStats()
    return [doc.text for doc in source.documents(stats)], stats


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "saved"
    ds = datasets.Dataset.from_dict({"text": TEXTS, "n": list(range(300)), "tags": [["a", "b"]] * 300})
    ds.save_to_disk(str(folder), num_shards=3)
    return folder


def test_save_to_disk_rows_in_order(saved):
    source = HFDatasetSource(str(saved), "text")
    texts, stats = _texts(source)
    expected = [t for t in datasets.load_from_disk(str(saved))["text"] if t and t.strip()]
    assert texts == expected and len(texts) > 250
    assert stats.skipped_empty == len(TEXTS) - len(expected)
    assert source.describe() == {"kind": "hf_dataset", "folder": str(saved), "layout": "save_to_disk", "files": 3,
                                 "text_column": "text"}
    assert [os.path.basename(p) for p in source.paths] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]


def test_keep_narrows_to_some_shards(saved):
    source = HFDatasetSource(str(saved), "text")
    whole = _texts(source)[0]
    source.keep([1, 2])
    assert whole[-len(_texts(source)[0]):] == _texts(source)[0] and len(_texts(source)[0]) < len(whole)


def test_a_folder_of_parquet_and_arrow_shards(tmp_path):
    folder = tmp_path / "repo" / "data"
    folder.mkdir(parents=True)
    table = pa.table({"content": TEXTS})
    pq.write_table(table.slice(0, 100), folder / "train-00000-of-00003.parquet")
    with pa.OSFile(str(folder / "train-00001-of-00003.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:  # IPC stream: what datasets writes
        writer.write_table(table.slice(100, 100))
    with pa.OSFile(str(folder / "train-00002-of-00003.arrow"), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as writer:  # IPC file (Feather v2)
        writer.write_table(table.slice(200, 100))
    (folder / "README.md").write_text("not a shard")
    source = HFDatasetSource(str(tmp_path / "repo"), "content")
    assert source.describe()["layout"] == "shards" and source.describe()["files"] == 3
    assert _texts(source)[0] == [t for t in TEXTS if t and t.strip()]


def test_a_dataset_dict_names_its_splits(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": ds, "validation": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(PrepareError, match=r"holds a DatasetDict \(splits: train, validation\): give one split's "
                                           rf"folder, e.g. {tmp_path}/dd/train"):
        HFDatasetSource(str(tmp_path / "dd"), "text")
    assert _texts(HFDatasetSource(str(tmp_path / "dd" / "train"), "text"))[0] == ["a", "b"]


@pytest.mark.parametrize("column, message", [
    ("body", r"data-00000-of-00003.arrow has no column 'body' \(it has: text, n, tags\); choose it with --text-column"),
    ("n", r"data-00000-of-00003.arrow: column 'n' is int64, not a string column"),
    ("tags", r"column 'tags' is list<item: string>, not a string column"),
])
def test_the_column_is_checked_up_front(saved, column, message):
    with pytest.raises(PrepareError, match=message):
        HFDatasetSource(str(saved), column)


def test_bad_folders(tmp_path, saved):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.parquet").write_text("x")
    cases = {str(tmp_path / "none"): "no such folder", str(tmp_path / "empty"): "holds no state.json",
             str(tmp_path / "file.parquet"): "is a file"}
    for folder, message in cases.items():
        with pytest.raises(PrepareError, match=message):
            HFDatasetSource(folder, "text")
    (saved / "data-00001-of-00003.arrow").unlink()
    with pytest.raises(PrepareError, match="the shard data-00001-of-00003.arrow that state.json lists is missing"):
        HFDatasetSource(str(saved), "text")
    (saved / "state.json").write_text('{"_data_files": [{"filename": "../escape.arrow"}]}')
    with pytest.raises(PrepareError, match="lists no shard files"):
        HFDatasetSource(str(saved), "text")
    (saved / "state.json").write_text("[" * 100_000)
    with pytest.raises(PrepareError, match="state.json is not readable JSON"):
        HFDatasetSource(str(saved), "text")


def test_a_shard_that_is_not_arrow_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.arrow").write_bytes(b"\x00" * 64)
    with pytest.raises(PrepareError, match=r"x.arrow: not a readable Arrow IPC file"):
        HFDatasetSource(str(tmp_path / "data"), "text")
