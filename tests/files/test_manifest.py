"""framework/files/manifest.py: the one home of manifest.json (written by `layerdrop prepare`,
read by the data module); remote reading is in tests/training/data/test_data_module.py (litdata's local:)."""

from __future__ import annotations

import hashlib
import json

import pytest

from framework.files.manifest import MANIFEST_FILE, MANIFEST_FORMAT, read_manifest, sha256_of, write_manifest


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
