"""framework/files/atomic_write.py: a target holds the old content or the new, never a part."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

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


# ------------------------------------------------------------------ every writer uses it

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("framework", "eval", "data_prep", "benchmarks")
# A call that creates or fills a file. A line that names the writer's ``partial`` path
# (or follows one that does: ``with replacing(p) as partial, open(partial, "wb") as h:``)
# writes where replacing() told it to.
WRITE = re.compile(r"\.write_(text|bytes)\(|\bopen\([^)]*['\"][wax]b?\+?['\"]|json\.dump\(|torch\.save\(|np\.save\("
                   r"|\bsave_file\(|\.savefig\(|(?<!plots)(?<!self)\.save\(|shutil\.copy(file|2|fileobj)?\("
                   r"|NamedTemporaryFile\(|\.to_csv\(|\.tofile\(")
# (file, a fragment of the line): why a plain write is right there.
ALLOWED = {
    ("data_prep/encoding.py", 'open(tokens_path, "wb")'): "scratch token stream in the staging folder's _work/",
    ("data_prep/encoding.py", ".tofile(out)"): "the same scratch token stream",
    ("data_prep/prepare.py", "np.save(spans_path"): "scratch spans in the staging folder's _work/",
    ("data_prep/prepare.py", "shutil.copyfile(given.path, path)"):
        "inside the staging folder, published whole by one rename (framework/files/staging.py)",
    ("data_prep/prepare.py", "tokenizer.save(path)"): "the same staging folder",
    ("eval/experiments/sweep/runner.py", 'open(log, "a")'): "a run's log, appended while its child runs",
    ("framework/strategies/fsdp2.py", 'open(path / LIGHTNING_META, "wb")'):
        "inside the DCP folder, which torch's FileSystemWriter writes in place on every rank; written last, "
        "after every shard, and a failure on any rank raises on all (FSDP2Strategy._agree)",
    ("framework/strategies/fsdp2.py", "torch.save(checkpoint, handle)"): "the same file",
    ("benchmarks/checkpoint_cost.py", 'open(log, "w")'): "a child's log in the benchmark's scratch folder",
    ("benchmarks/startup_time.py", "tokenizer.save("): "a tokenizer in a temporary folder",
}


def write_calls() -> list[tuple[str, str]]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where == "framework/files/atomic_write.py":
                continue
            lines = path.read_text().splitlines()
            for number, line in enumerate(lines):
                code = line.split("#")[0] if not line.lstrip().startswith("#") else ""
                if WRITE.search(code) and "partial" not in code and "partial" not in lines[number - 1]:
                    found.append((where, line.strip()))
    return found


def test_every_file_is_written_through_the_atomic_writer():
    """A plain write to a final path leaves half a file when the process dies in it."""
    bypassing = [f"{where}: {line}" for where, line in write_calls()
                 if not any(where == file and fragment in line for file, fragment in ALLOWED)]
    assert bypassing == [], "write through framework/files/atomic_write.py, or allow it here with a reason"


def test_the_allowed_plain_writes_still_exist():
    calls = write_calls()
    stale = [key for key in ALLOWED if not any(where == key[0] and key[1] in line for where, line in calls)]
    assert stale == []


def test_the_check_finds_a_plain_write(tmp_path):
    assert WRITE.search('Path(out).write_text(text)') and WRITE.search('with open(target, "w") as f:')
    assert WRITE.search("fig.savefig(path)") and not WRITE.search("write_text(path, text)")
