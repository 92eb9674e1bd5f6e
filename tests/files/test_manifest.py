"""framework/files/manifest.py: the one home of manifest.json (written by `layerdrop prepare`,
read by the data module); remote reading is in tests/training/data/test_data_module.py (litdata's local:)."""

from __future__ import annotations

import hashlib
import json

import pytest

from framework.files.manifest import (MANIFEST_FILE, MANIFEST_FORMAT, data_identity, read_manifest, sha256_of,
                                     write_manifest)


def test_written_manifest_reads_back_and_is_byte_stable(tmp_path):
    manifest = {"format": MANIFEST_FORMAT, "tokenizer": {"vocab_size": 2048}, "splits": {}}
    path = write_manifest(tmp_path, manifest)
    first = (tmp_path / MANIFEST_FILE).read_bytes()
    assert path == str(tmp_path / MANIFEST_FILE) and read_manifest(str(tmp_path)) == manifest
    write_manifest(tmp_path, manifest)
    assert (tmp_path / MANIFEST_FILE).read_bytes() == first == (json.dumps(manifest, indent=2) + "\n").encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]


def test_a_folder_without_one_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no manifest.json in .*: is it a folder made by `layerdrop prepare"):
        read_manifest(str(tmp_path))


def test_the_tokenizer_record_is_the_files_sha256(tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(b"x" * (3 << 20))
    assert sha256_of(tmp_path / "tokenizer.json") == hashlib.sha256(b"x" * (3 << 20)).hexdigest()


@pytest.mark.parametrize("change, key, value", [
    ({"splits": {"train": {"path": "../../data/train"}}}, "splits.train.path", "../../data/train"),
    ({"splits": {"val": {"path": "/etc"}}}, "splits.val.path", "/etc"),
    ({"splits": {"val": {"path": "val/../../x"}}}, "splits.val.path", "val/../../x"),
    ({"splits": {"val": {"path": ""}}}, "splits.val.path", ""),
    ({"splits": {"val": {"tokens": 3}}}, "splits.val.path", ""),
    ({"splits": {"val": {"path": 3}}}, "splits.val.path", 3),
    ({"splits": {"val": {"path": "s3://bucket/val"}}}, "splits.val.path", "s3://bucket/val"),
    ({"tokenizer": {"file": "../../secret.json"}}, "tokenizer.file", "../../secret.json"),
])
def test_paths_outside_the_folder_are_refused_naming_the_key(tmp_path, change, key, value):
    """Issue 46: a split path ../../data/train was read from outside the prepared folder (rc 0)."""
    manifest = {"format": MANIFEST_FORMAT, "tokenizer": {"file": "tokenizer.json"},
                "splits": {"train": {"path": "train"}, "val": {"path": "val"}}}
    for section, entry in change.items():
        manifest[section] = {**manifest[section], **entry}
    write_manifest(tmp_path, manifest)
    with pytest.raises(ValueError) as refusal:
        read_manifest(str(tmp_path))
    assert str(refusal.value) == (f"{tmp_path / MANIFEST_FILE}: {key}={value!r} is invalid: a path inside the prepared "
                                  "folder (relative, without '..')")


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "is invalid: expected a JSON object"),
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes (line 1)"),
    ('{"splits": ' + "[" * 5_000 + "]" * 5_000 + "}", "is refused: it is nested more than 100 levels deep"),
])
def test_a_manifest_that_is_not_a_json_object_is_one_line(tmp_path, text, message):
    (tmp_path / MANIFEST_FILE).write_text(text)
    with pytest.raises(ValueError) as refusal:
        read_manifest(str(tmp_path))
    assert str(refusal.value).startswith(f"{tmp_path / MANIFEST_FILE} {message}")


def test_a_prepared_folder_whose_split_points_outside_is_refused_before_reading(prepared_tokens, tmp_path):
    """The data module joined the split path under the folder and streamed whatever was there."""
    import shutil

    from framework.training.data import TokenDataModule

    folder = tmp_path / "a" / "data"
    shutil.copytree(prepared_tokens, folder)
    shutil.copytree(prepared_tokens / "val", tmp_path / "elsewhere")
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    manifest["splits"]["val"]["path"] = "../../elsewhere"
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    module = TokenDataModule(str(folder), seq_len=32, batch_size=2)
    with pytest.raises(ValueError, match=r"splits.val.path='../../elsewhere' is invalid: a path inside the prepared"):
        module.setup("validate")
        next(iter(module.val_dataloader()))


def test_the_data_identity_ignores_where_the_folder_lies_and_sees_one_document_or_merge_more():
    """Path-free: the same data prepared into another folder by another command line compares
    equal; a split with one more document, or another tokenizer, does not."""
    manifest = {"format": MANIFEST_FORMAT, "command": "layerdrop prepare --out data/a", "seed": 0,
                "tokenizer": {"file": "tokenizer.json", "sha256": "0" * 64, "vocab_size": 300},
                "sources": [{"kind": "builtin", "stdlib_root": "/usr/lib/python3"}],
                "splits": {"val": {"path": "val", "documents": 3, "tokens": 90, "chunks": 1},
                           "train": {"path": "train", "documents": 50, "tokens": 1500, "chunks": 2}}}
    identity = data_identity(manifest)
    assert identity == {"tokenizer_sha256": "0" * 64, "splits": {"train": {"documents": 50, "tokens": 1500},
                                                              "val": {"documents": 3, "tokens": 90}}}
    elsewhere = json.loads(json.dumps(manifest))
    elsewhere["command"], elsewhere["sources"][0]["stdlib_root"] = "layerdrop prepare --out /b", "/opt/python3"
    assert data_identity(elsewhere) == identity
    more = json.loads(json.dumps(manifest))
    more["splits"]["train"]["documents"] = 51
    other = json.loads(json.dumps(manifest))
    other["tokenizer"]["sha256"] = "1" * 64
    assert data_identity(more) != identity and data_identity(other) != identity
