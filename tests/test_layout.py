"""The folder structure of DESIGN.md: no folder of framework/, eval/ or data_prep/ holds
more than 15 Python modules flat, and no other folder of the project more than 20. A concern
that outgrows that becomes a package of its own (as framework/ became model/, training/,
recipes/, files/ beside checkpoint/, families/, strategies/)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The most .py files one folder may hold flat, by top folder.
MOST_MODULES = {"framework": 15, "data_prep": 15, "eval": 15, "benchmarks": 20, "tests": 20, "recipes": 20}


def crowded_folders(root: Path, limits: dict[str, int] = MOST_MODULES) -> dict[str, int]:
    """{folder relative to root: its number of .py files} for every folder over its top folder's limit."""
    crowded = {}
    for name, limit in limits.items():
        top = root / name
        for folder in sorted([top, *top.rglob("*")] if top.is_dir() else []):
            count = len(list(folder.glob("*.py"))) if folder.is_dir() and "__pycache__" not in folder.parts else 0
            if count > limit:
                crowded[str(folder.relative_to(root))] = count
    return crowded


def test_no_folder_holds_more_modules_flat_than_its_limit():
    assert crowded_folders(REPO) == {}, "split these folders into packages by role"


def test_a_crowded_folder_is_found(tmp_path):
    for top in ("framework", "eval"):
        (tmp_path / top / "deep").mkdir(parents=True)
        for n in range(MOST_MODULES[top]):
            (tmp_path / top / "deep" / f"m{n}.py").write_text("")
    assert crowded_folders(tmp_path) == {}
    for top in ("framework", "eval"):
        (tmp_path / top / "deep" / "one_more.py").write_text("")
    assert crowded_folders(tmp_path) == {"eval/deep": 16, "framework/deep": 16}


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
