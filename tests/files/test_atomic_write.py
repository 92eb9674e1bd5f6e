"""framework/files/atomic_write.py: a target holds the old content or the new, never a part."""

from __future__ import annotations

import json
import os
import threading

import pytest

from framework.files.atomic_write import copy_file, replacing, write_json, write_text


def test_write_json_creates_the_folder_and_ends_with_a_newline(tmp_path):
    path = write_json(tmp_path / "a" / "b" / "report.json", {"x": [1, 2]})
    assert path.read_text().endswith("}\n")
    assert json.loads(path.read_text()) == {"x": [1, 2]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]  # no partial file left


def test_a_failed_write_leaves_the_old_content_and_no_partial_file(tmp_path):
    path = write_text(tmp_path / "status.json", "old\n")
    with pytest.raises(RuntimeError, match="killed"):
        with replacing(path) as partial:
            partial.write_text("half of the ne")
            raise RuntimeError("killed while writing")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["status.json"]


def test_the_partial_file_is_hidden_beside_the_target_and_new_content_replaces_old(tmp_path):
    path = write_text(tmp_path / "config.yaml", "old\n")
    with replacing(path) as partial:
        assert partial.parent == path.parent and partial.name.startswith(".config.yaml.partial-")
        partial.write_text("new\n")
        assert path.read_text() == "old\n"  # not visible before the rename
    assert path.read_text() == "new\n"


def test_concurrent_writers_of_one_target_never_mix(tmp_path):
    path = tmp_path / "status.json"
    texts = [json.dumps({"writer": i, "pad": "x" * 100_000}) for i in range(8)]
    threads = [threading.Thread(target=write_text, args=(path, text)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert path.read_text() in texts
    assert os.listdir(tmp_path) == ["status.json"]


def test_copy_file(tmp_path):
    source = write_text(tmp_path / "tokenizer.json", '{"model": {}}')
    assert copy_file(source, tmp_path / "out" / "tokenizer.json").read_text() == '{"model": {}}'
