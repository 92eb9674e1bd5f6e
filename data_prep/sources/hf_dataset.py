"""A Hugging Face ``datasets`` folder (``--hf-dataset DIR``): one document per non-null
value of the string column ``--text-column``.

Two layouts:

* what ``Dataset.save_to_disk`` writes: ``state.json`` lists the Arrow IPC shards
  (``data-00000-of-00004.arrow`` ...) in row order; ``dataset_info.json`` beside it;
* a folder of shards as a dataset repository or ``datasets``' cache holds them: every
  ``.arrow`` / ``.parquet`` file below the folder, in sorted path order.

A ``DatasetDict`` folder (``dataset_dict.json`` and one folder per split) is refused with
the names of its splits: give one split's folder.

Read with pyarrow, the library ``datasets`` reads these files with, rather than through
``datasets`` itself: ``load_from_disk`` concatenates the shards into one table (no
shard-by-file for ``prepare --shard``) and ``load_dataset("parquet"/"arrow")`` first copies
the whole corpus into its cache. Only JSON and Arrow/Parquet are read: nothing unpickles.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterator

from data_prep.errors import PrepareError
from data_prep.sources.columns import arrow_schema, check_text_column, column_documents, is_parquet, parquet_schema
from data_prep.sources.document import Document, SourceStats
from data_prep.sources.paths import keep_positions, walk_files

STATE_FILE = "state.json"
DATASET_DICT_FILE = "dataset_dict.json"
SHARD_SUFFIXES = (".arrow", ".parquet")


@dataclass
class HFDatasetSource:
    folder: str
    text_column: str
    flag = "--hf-dataset"
    layout: str = field(init=False)
    paths: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.layout, self.paths = self._shards()
        for path in self.paths:
            where = f"{self.flag} {self.folder!r}: {os.path.relpath(path, self.folder)}"
            schema = parquet_schema(path, where) if is_parquet(path) else arrow_schema(path, where)
            check_text_column(schema, self.text_column, where)

    def _shards(self) -> tuple[str, list[str]]:
        where = f"{self.flag} {self.folder!r}"
        if not os.path.isdir(self.folder):
            raise PrepareError(f"{where}: no such folder" if not os.path.exists(self.folder) else
                               f"{where} is a file: give the folder of a datasets save_to_disk or of its "
                               "shards (a single Parquet file: --parquet)")
        if os.path.isfile(os.path.join(self.folder, DATASET_DICT_FILE)):
            splits = _read_json(os.path.join(self.folder, DATASET_DICT_FILE), where).get("splits")
            names = [str(name) for name in splits] if isinstance(splits, list) else []
            raise PrepareError(f"{where} holds a DatasetDict (splits: {', '.join(names) or 'none listed'}): give "
                               f"one split's folder, e.g. {os.path.join(self.folder, names[0] if names else 'train')}")
        if os.path.isfile(os.path.join(self.folder, STATE_FILE)):
            return "save_to_disk", self._state_shards(where)
        shards = [path for path in walk_files(self.folder) if path.endswith(SHARD_SUFFIXES)]
        if not shards:
            raise PrepareError(f"{where} holds no {STATE_FILE} (a save_to_disk folder) and no .arrow or .parquet "
                               "files")
        return "shards", shards

    def _state_shards(self, where: str) -> list[str]:
        state = _read_json(os.path.join(self.folder, STATE_FILE), where)
        files = state.get("_data_files")
        names = [entry.get("filename") for entry in files if isinstance(entry, dict)] if isinstance(files, list) else []
        if not names or not all(isinstance(n, str) and n == os.path.basename(n) and n not in ("", ".", "..")
                                for n in names):
            raise PrepareError(f"{where}: {STATE_FILE} lists no shard files (_data_files): not a datasets "
                               "save_to_disk folder")
        paths = [os.path.join(self.folder, name) for name in names]
        if (missing := next((p for p in paths if not os.path.isfile(p)), None)) is not None:
            raise PrepareError(f"{where}: the shard {os.path.basename(missing)} that {STATE_FILE} lists is missing")
        return paths

    def describe(self) -> dict:
        return {"kind": "hf_dataset", "folder": self.folder, "layout": self.layout, "files": len(self.paths),
                "text_column": self.text_column}

    def keep(self, positions: list[int]) -> None:
        self.paths = keep_positions(self.paths, positions)

    def documents(self, stats: SourceStats) -> Iterator[Document]:
        return column_documents(self.paths, self.text_column, stats)


def _read_json(path: str, where: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, ValueError, RecursionError) as error:
        raise PrepareError(f"{where}: {os.path.basename(path)} is not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise PrepareError(f"{where}: {os.path.basename(path)} is not a JSON object")
    return value
