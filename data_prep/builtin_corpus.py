"""The embedded default corpus: code and English prose that every machine already has.

* code: the Python standard library's ``.py`` sources (``sysconfig``'s "stdlib" path,
  without site-packages / dist-packages and ``__pycache__``);
* prose: the English man pages under ``/usr/share/man/man1..man8`` (gzip or plain),
  rendered to plain text by `data_prep.man_page`. Symlinked pages and ``.so``
  redirect pages are duplicates and are skipped. Pages of one family (the name before
  the first ``-``, ``_`` or ``.``) are capped at ``MAN_FAMILY_CAP``: machines here
  carry ~16,600 generated ``gcloud`` reference pages that would otherwise be most of
  the prose.

Halves: ``--corpus builtin:code`` is the stdlib alone and ``builtin:prose`` the man pages
alone, each in the order it has inside the whole corpus, so two sources of a mixture. A
tokenizer trained for a half trains on the whole builtin corpus (``tokenizer_corpus``):
the halves of a mixture must share one tokenizer, and one that saw both code and prose
encodes each as well as the mixture's other half (a per-source loss in nats per token
compares like with like); with the same ``--vocab-size`` and ``--max-tokens`` the two
halves then get the same tokenizer, byte for byte, in whichever order or place they are
prepared.

Order: every document gets the key ``sha256("<kind>:<relative path>")`` and the
corpus is read in key order, which interleaves code and prose. It depends only on
the file names, so a ``--max-tokens`` cap takes the same representative sample on
every run (and on every machine with the same files).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass, field
from typing import Iterator

from data_prep.man_page import render_man_page
from data_prep.sources.document import Document, SourceStats, accept, decode_text

MAN_ROOT = "/usr/share/man"
MAN_SECTIONS = tuple(f"man{section}" for section in range(1, 9))
MAN_FAMILY_CAP = 200
# --corpus value -> the kinds of file it reads
CORPORA = {"builtin": ("stdlib", "man"), "builtin:code": ("stdlib",), "builtin:prose": ("man",)}
_EXCLUDED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class BuiltinFile:
    kind: str  # "stdlib" | "man"
    path: str
    relative: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.kind}:{self.relative}".encode()).hexdigest()


def stdlib_files(root: str | None = None) -> list[BuiltinFile]:
    root = root or sysconfig.get_paths()["stdlib"]
    files = []
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _EXCLUDED_STDLIB_DIRS)
        for name in sorted(names):
            path = os.path.join(directory, name)
            if name.endswith(".py") and not os.path.islink(path):
                files.append(BuiltinFile("stdlib", path, os.path.relpath(path, root)))
    return files


def _man_family(name: str) -> str:
    return re.split(r"[-_.]", name, maxsplit=1)[0]


def man_files(root: str = MAN_ROOT) -> list[BuiltinFile]:
    candidates = []
    for section in MAN_SECTIONS:
        directory = os.path.join(root, section)
        if not os.path.isdir(directory):
            continue
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.is_file(follow_symlinks=False):  # symlinked pages are duplicates
                candidates.append(BuiltinFile("man", entry.path, f"{section}/{entry.name}"))
    # Cap each family with a spread over it (not its alphabetical head). The pick uses
    # its own hash: picking the pages with the smallest order keys would put the whole
    # capped family at the front of the corpus.
    kept, per_family = [], {}
    for page in sorted(candidates, key=lambda f: hashlib.sha256(f"family:{f.relative}".encode()).digest()):
        family = _man_family(os.path.basename(page.path))
        per_family[family] = per_family.get(family, 0) + 1
        if per_family[family] <= MAN_FAMILY_CAP:
            kept.append(page)
    return kept


def _read_text(file: BuiltinFile, stats: SourceStats) -> str:
    opener = gzip.open if file.path.endswith(".gz") else open
    with opener(file.path, "rb") as handle:
        raw = handle.read()
    text = decode_text(raw, stats)
    return render_man_page(text) if file.kind == "man" else text


@dataclass
class BuiltinSource:
    """Python standard library + rendered man pages (or one of them), in a fixed interleaved order."""

    stdlib_root: str | None = None
    man_root: str = MAN_ROOT
    corpus: str = "builtin"  # a key of CORPORA
    flag = "--corpus"
    files: list[BuiltinFile] = field(init=False)

    def __post_init__(self) -> None:
        kinds = CORPORA[self.corpus]
        found = (stdlib_files(self.stdlib_root) if "stdlib" in kinds else []) + \
            (man_files(self.man_root) if "man" in kinds else [])
        self.files = sorted(found, key=lambda f: f.key)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def keep(self, positions: list[int]) -> None:
        self.files = [self.files[i] for i in positions]

    def tokenizer_corpus(self) -> "BuiltinSource":
        """What a tokenizer trained for this corpus trains on: the whole builtin corpus."""
        return BuiltinSource(self.stdlib_root, self.man_root)

    def describe(self) -> dict:
        counts = {kind: sum(f.kind == kind for f in self.files) for kind in ("stdlib", "man")}
        return {"kind": "builtin", "corpus": self.corpus,
                "stdlib_root": self.stdlib_root or sysconfig.get_paths()["stdlib"],
                "man_root": self.man_root, "stdlib_files": counts["stdlib"], "man_pages": counts["man"],
                "man_family_cap": MAN_FAMILY_CAP}

    def documents(self, stats: SourceStats) -> Iterator[Document]:
        for file in self.files:
            text = _read_text(file, stats)
            if (doc := accept(text, f"{file.kind}:{file.relative}", stats)) is not None:
                yield doc
