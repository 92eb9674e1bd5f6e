"""The folder structure of DESIGN.md: no folder of the project holds more than 20 Python
modules flat. A concern that outgrows that becomes a package of its own (as framework/
became model/, training/, recipes/, files/ beside checkpoint/, families/, strategies/)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("framework", "eval", "data_prep", "benchmarks", "tests", "recipes")
MOST_MODULES = 20


def crowded_folders(root: Path, roots: tuple[str, ...] = ROOTS) -> dict[str, int]:
    """{folder relative to root: its number of .py files} for every folder over the limit."""
    folders = [root / name for name in roots if (root / name).is_dir()]
    folders += [path for folder in folders for path in folder.rglob("*") if path.is_dir()]
    counts = {str(folder.relative_to(root)): len(list(folder.glob("*.py")))
              for folder in folders if "__pycache__" not in folder.parts}
    return {folder: count for folder, count in sorted(counts.items()) if count > MOST_MODULES}


def test_no_folder_holds_more_than_20_modules_flat():
    assert crowded_folders(REPO) == {}, "split these folders into packages by role"


def test_a_crowded_folder_is_found(tmp_path):
    for n in range(MOST_MODULES):
        (tmp_path / "eval" / "deep").mkdir(parents=True, exist_ok=True)
        (tmp_path / "eval" / "deep" / f"m{n}.py").write_text("")
    assert crowded_folders(tmp_path) == {}
    (tmp_path / "eval" / "deep" / "one_more.py").write_text("")
    assert crowded_folders(tmp_path) == {"eval/deep": MOST_MODULES + 1}


def shared_test_names(tests: Path) -> dict[str, list[str]]:
    """Test modules whose file names clash: pytest imports a test module by its bare name
    (no __init__.py), so two of one name stop a full run at collection."""
    found: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        found.setdefault(path.name, []).append(str(path.relative_to(tests)))
    return {name: paths for name, paths in found.items() if len(paths) > 1}


def test_no_two_test_modules_share_a_name(tmp_path):
    assert shared_test_names(REPO / "tests") == {}, "rename one (e.g. tests/families/test_family_registry.py)"
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_registry.py").write_text("")
    assert shared_test_names(tmp_path) == {"test_registry.py": ["a/test_registry.py", "b/test_registry.py"]}
