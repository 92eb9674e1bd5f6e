import os
import subprocess
import sys

import pytest

from data_prep.errors import PrepareError
from data_prep.output_folder import StagingFolder, check_output_folder, clean_leftovers_beside


def test_refuses_data_a_file_or_a_url(tmp_path):
    check_output_folder(str(tmp_path / "new"), overwrite=False)
    check_output_folder(str(tmp_path), overwrite=False)  # empty folder: fine
    (tmp_path / "old.bin").write_text("precious")
    with pytest.raises(PrepareError, match=r"already holds data \(1 entries\); pass --overwrite"):
        check_output_folder(str(tmp_path), overwrite=False)
    with pytest.raises(PrepareError, match=r"holds 1 entries but no manifest.json"):
        check_output_folder(str(tmp_path), overwrite=True)  # --overwrite replaces prepared data only
    (tmp_path / "manifest.json").write_text("{}")
    check_output_folder(str(tmp_path), overwrite=True)
    with pytest.raises(PrepareError, match="is a file"):
        check_output_folder(str(tmp_path / "old.bin"), overwrite=True)
    with pytest.raises(PrepareError, match="local folder"):
        check_output_folder("s3://bucket/data", overwrite=False)


def test_refuses_a_folder_holding_an_input_even_through_a_link(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    (tmp_path / "data" / "corpus.txt").write_text("text")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    check_output_folder(str(tmp_path / "data"), True, {"--files": [str(tmp_path / "elsewhere.txt")]})
    with pytest.raises(PrepareError, match=r"holds the input --files '.*link/corpus.txt', which replacing"):
        check_output_folder(str(tmp_path / "data"), True, {"--files": [str(tmp_path / "link" / "corpus.txt")]})


def test_commit_swaps_in_the_new_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    folder = StagingFolder(str(out))
    with folder as staging:
        assert os.path.dirname(staging) == str(tmp_path) and os.path.basename(staging).startswith(".out.")
        (tmp_path / "out" / "old.txt").read_text()  # still in place while the run works
        open(os.path.join(staging, "new.txt"), "w").write("new")
        folder.commit()
    assert os.listdir(out) == ["new.txt"]
    assert os.listdir(tmp_path) == ["out"]


def test_a_failed_run_leaves_the_old_folder_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with StagingFolder(str(out)) as staging:
            open(os.path.join(staging, "half.txt"), "w").write("half")
            raise RuntimeError("crash mid-run")
    assert os.listdir(out) == ["old.txt"] and (out / "old.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["out"]


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_leftovers_of_killed_runs_are_cleaned_and_live_ones_kept(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    for name in (f".out.staging-{dead}", f".out.staging-{alive}", f".other.staging-{dead}"):
        (tmp_path / name).mkdir()
    (tmp_path / f".out.replaced-{dead}").mkdir()
    (tmp_path / f".out.replaced-{dead}" / "old.txt").write_text("old")  # killed between the two renames
    assert clean_leftovers_beside(str(tmp_path / "out")) == [f".out.staging-{dead}"]
    assert sorted(os.listdir(tmp_path)) == [f".other.staging-{dead}", f".out.staging-{alive}", "out"]
    assert (tmp_path / "out" / "old.txt").read_text() == "old"  # put back, not lost
    (tmp_path / f".out.replaced-{dead}").mkdir()  # beside data that is in place: just a leftover
    assert clean_leftovers_beside(str(tmp_path / "out")) == [f".out.replaced-{dead}"]
