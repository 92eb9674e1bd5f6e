import os

import pytest

from data_prep.builtin_corpus import MAN_FAMILY_CAP, BuiltinSource, _man_family, man_files
from data_prep.sources.document import SourceStats


@pytest.fixture(scope="module")
def builtin():
    return BuiltinSource()


def test_order_is_deterministic_and_interleaved(builtin):
    again = BuiltinSource()
    assert [f.path for f in builtin.files] == [f.path for f in again.files]
    head = builtin.files[:100]
    kinds = {f.kind for f in head}
    if os.path.isdir("/usr/share/man/man1"):
        assert kinds == {"stdlib", "man"}  # a capped corpus has both code and prose
    keys = [f.key for f in builtin.files]
    assert keys == sorted(keys)


def test_stdlib_part_excludes_installed_packages_and_symlinks(builtin):
    stdlib = [f for f in builtin.files if f.kind == "stdlib"]
    assert len(stdlib) > 500
    assert all(f.path.endswith(".py") and not os.path.islink(f.path) for f in stdlib)
    assert not any(part in f.relative.split(os.sep) for f in stdlib
                   for part in ("site-packages", "dist-packages", "__pycache__"))


def test_man_families_are_capped(tmp_path):
    section = tmp_path / "man1"
    section.mkdir()
    for i in range(MAN_FAMILY_CAP + 50):
        (section / f"tool_sub{i}.1").write_text(f".TH T 1\nsub {i}\n")
    (section / "other.1").write_text(".TH O 1\nother\n")
    (section / "link.1").symlink_to(section / "other.1")
    pages = man_files(str(tmp_path))
    families = [_man_family(os.path.basename(p.path)) for p in pages]
    assert families.count("tool") == MAN_FAMILY_CAP
    assert families.count("other") == 1 and families.count("link") == 0


def test_documents_render_man_pages(tmp_path):
    (tmp_path / "man1").mkdir()
    (tmp_path / "man1" / "demo.1").write_text('.TH DEMO 1\n.SH NAME\ndemo \\- shows \\fBthings\\fR\n')
    (tmp_path / "man1" / "alias.1").write_text(".so man1/demo.1\n")
    stdlib = tmp_path / "lib"
    stdlib.mkdir()
    (stdlib / "mod.py").write_bytes(b"x = '\xff'\n")
    source = BuiltinSource(stdlib_root=str(stdlib), man_root=str(tmp_path))
    stats = SourceStats()
    texts = sorted(doc.text for doc in source.documents(stats))
    assert texts == ["DEMO(1)\n\nNAME\ndemo - shows things\n", "x = '\ufffd'\n"]
    assert (stats.documents, stats.skipped_empty, stats.invalid_utf8) == (2, 1, 1)
    assert source.describe()["man_pages"] == 2 and source.describe()["stdlib_files"] == 1


def test_the_halves_split_the_whole_corpus_without_changing_its_order(builtin):
    """builtin:code and builtin:prose are the stdlib and man files of --corpus builtin, each
    in the whole corpus's order, and --corpus builtin is their interleaving by key, as before."""
    code, prose = BuiltinSource(corpus="builtin:code"), BuiltinSource(corpus="builtin:prose")
    assert [f.path for f in code.files] == [f.path for f in builtin.files if f.kind == "stdlib"]
    assert [f.path for f in prose.files] == [f.path for f in builtin.files if f.kind == "man"]
    assert sorted(code.files + prose.files, key=lambda f: f.key) == builtin.files
    assert code.describe()["corpus"] == "builtin:code" and code.describe()["man_pages"] == 0
    assert code.tokenizer_corpus().files == builtin.files and code.paths == [f.path for f in code.files]


def test_keep_narrows_the_files(tmp_path):
    stdlib = tmp_path / "lib"
    stdlib.mkdir()
    for name in "abc":
        (stdlib / f"{name}.py").write_text(f"{name} = 1\n")
    source = BuiltinSource(stdlib_root=str(stdlib), man_root=str(tmp_path / "none"), corpus="builtin:code")
    kept = source.files[1]
    source.keep([1])
    assert source.files == [kept] and [doc.text for doc in source.documents(SourceStats())] == [
        open(kept.path).read()]
