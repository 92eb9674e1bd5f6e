"""``layerdrop prepare merge PART... --out DIR``: join the folders that ``prepare --shard
I/N`` wrote on N machines into one prepared folder with one manifest.

Each split's chunks are joined by litdata's own ``merge_datasets``: it copies every part's
chunk files under new names, in the order given, and writes one ``index.json`` from the
parts' indexes. The parts are taken in shard order, so each merged split holds the same
documents in the same order as one machine's prepare of the whole input: the split's
token stream is identical. The chunk files are not: each part's last chunk of a split
is short (a ``TokensLoader`` reader drops at most one block's tail per chunk, so a merge
of N parts loses at most N - 1 more blocks' tails per split than one machine's folder).

Refused in one line, before anything is written: a folder that is not a part; a part
given twice, or two parts with one index; parts of different shard counts, of other
inputs or options (their corpus fingerprints differ) or with other tokenizers (sha256,
EOS, BOS or document start); a missing part; a split no part has a document in; a part
whose chunk files are incomplete.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass

from data_prep.errors import PrepareError
from framework.command_parser import CommandParser
from framework.files.atomic_write import copy_file
from framework.files.manifest import MANIFEST_FORMAT, read_manifest, sha256_of, write_manifest

SPLITS = ("train", "val")
# What must agree for token ids to mean the same strings and documents to start alike.
TOKENIZER_KEYS = ("sha256", "eos_id", "bos_id", "document_start")


@dataclass
class Part:
    path: str
    manifest: dict

    @property
    def shard(self) -> dict:
        return self.manifest["shard"]

    def __str__(self) -> str:
        return f"{self.path!r} (part {self.shard['index']}/{self.shard['count']})"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="layerdrop prepare merge",
        description="Join the folders of `layerdrop prepare --shard I/N` (all N of them) into one prepared folder.",
        epilog="Example: layerdrop prepare merge parts/1 parts/2 parts/3 parts/4 --out data/corpus",
    )
    parser.add_argument("parts", nargs="+", metavar="PART", help="the folders of the parts, in any order")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to create")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds prepared data")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8), metavar="N",
                        help="threads copying chunk files")
    return parser


def _read_part(path: str) -> Part:
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        raise PrepareError(f"{path!r} has no manifest.json: not a folder made by layerdrop prepare --shard") from None
    except ValueError as error:
        raise PrepareError(f"{path!r}: its manifest.json is not readable ({error})") from None
    shard = manifest.get("shard") if isinstance(manifest, dict) else None
    if not isinstance(shard, dict) or not {"index", "count", "corpus_sha256"} <= set(shard):
        raise PrepareError(f"{path!r} was prepared without --shard: it is not a part (nothing to merge)")
    return Part(path, manifest)


def check_parts(parts: list[Part]) -> list[Part]:
    """The parts in shard order, or PrepareError naming the first problem."""
    seen: dict[str, Part] = {}
    for part in parts:
        if (earlier := seen.get(os.path.realpath(part.path))) is not None:
            raise PrepareError(f"{earlier.path!r} is given twice (overlapping parts)")
        seen[os.path.realpath(part.path)] = part
    first = parts[0]
    by_index: dict[int, Part] = {}
    for part in parts:
        if part.shard["count"] != first.shard["count"]:
            raise PrepareError(f"{first} and {part} come from different shard counts: give the parts of one "
                               "prepare --shard I/N run")
        if (other := by_index.get(part.shard["index"])) is not None:
            raise PrepareError(f"{other.path!r} and {part.path!r} are both part {part.shard['index']}/"
                               f"{part.shard['count']} (overlapping parts)")
        by_index[part.shard["index"]] = part
        _check_same_tokenizer(first, part)
        if part.shard["corpus_sha256"] != first.shard["corpus_sha256"]:
            raise PrepareError(f"{part} was prepared from other inputs or options than {first} (their corpus "
                               "fingerprints differ): give the parts of one prepare command")
    count = first.shard["count"]
    if missing := [str(i) for i in range(1, count + 1) if i not in by_index]:
        raise PrepareError(f"part(s) {', '.join(missing)} of {count} missing: give all {count} parts")
    ordered = [by_index[i] for i in range(1, count + 1)]
    for name in SPLITS:
        if not sum(part.manifest["splits"][name]["documents"] for part in ordered):
            raise PrepareError(f"no part has a document in the {name} split (the document hash put none there): "
                               "raise --val-fraction, or prepare on one machine, which moves one document into "
                               "an empty split")
    for part in ordered:
        _check_chunks(part)
    return ordered


def _check_same_tokenizer(first: Part, part: Part) -> None:
    mine, theirs = first.manifest["tokenizer"], part.manifest["tokenizer"]
    if (differ := [key for key in TOKENIZER_KEYS if mine.get(key) != theirs.get(key)]):
        key = differ[0]
        raise PrepareError(f"{part} was prepared with another tokenizer than {first} ({key} "
                           f"{str(theirs.get(key))[:16]} vs {str(mine.get(key))[:16]}): a folder has one tokenizer; "
                           "prepare every part with the same --tokenizer")


def _check_chunks(part: Part) -> None:
    for name in SPLITS:
        split = part.manifest["splits"][name]
        if not split["chunks"]:
            continue
        folder = os.path.join(part.path, split["path"])
        try:
            with open(os.path.join(folder, "index.json")) as handle:
                chunks = json.load(handle)["chunks"]
        except (OSError, ValueError, KeyError, TypeError):
            raise PrepareError(f"{part}: {folder}/index.json is missing or unreadable") from None
        absent = [c.get("filename") for c in chunks if not os.path.isfile(os.path.join(folder, str(c.get("filename"))))]
        if len(chunks) != split["chunks"] or absent:
            raise PrepareError(f"{part}: the {name} split is incomplete ({len(chunks)} of {split['chunks']} chunks "
                               f"listed{', missing ' + absent[0] if absent else ''})")


def _merge_split(parts: list[Part], name: str, out: str, workers: int) -> int:
    from litdata.processing.functions import merge_datasets

    from data_prep.chunks import stamp_index_with_content_hash

    folders = [os.path.join(p.path, p.manifest["splits"][name]["path"]) for p in parts
               if p.manifest["splits"][name]["chunks"]]
    target = os.path.join(out, name)
    if len(folders) == 1:  # litdata merges two or more
        shutil.copytree(folders[0], target)
    else:
        merge_datasets([os.path.abspath(f) for f in folders], target, max_workers=max(1, workers))
    stamp_index_with_content_hash(target)
    with open(os.path.join(target, "index.json")) as handle:
        return len(json.load(handle)["chunks"])


def _sources(parts: list[Part]) -> list[dict]:
    """Each source as described (the whole corpus, the same in every part), with what the parts read summed."""
    merged = []
    for number, source in enumerate(parts[0].manifest["sources"]):
        read = {key: sum(p.manifest["sources"][number]["read"][key] for p in parts) for key in source["read"]}
        merged.append({**source, "read": read})
    return merged


def merged_manifest(parts: list[Part], argv: list[str], chunks: dict[str, int]) -> dict:
    first = parts[0].manifest
    splits = {name: {"path": name, "documents": sum(p.manifest["splits"][name]["documents"] for p in parts),
                     "tokens": sum(p.manifest["splits"][name]["tokens"] for p in parts), "chunks": chunks[name]}
              for name in SPLITS}
    return {
        "format": MANIFEST_FORMAT,
        "command": shlex.join(["layerdrop", "prepare", "merge", *argv]),
        "seed": first["seed"], "val_fraction": first["val_fraction"], "max_tokens": None,
        "chunk_tokens": first["chunk_tokens"], "dtype": first["dtype"],
        "tokenizer": first["tokenizer"],
        "sources": _sources(parts),
        "invalid_utf8_documents": sum(p.manifest["invalid_utf8_documents"] for p in parts),
        "truncated_last_document": False,
        "merged": {"count": len(parts), "corpus_sha256": parts[0].shard["corpus_sha256"],
                   "parts": [p.manifest["command"] for p in parts]},
        "splits": splits,
    }


def merge(args: argparse.Namespace, argv: list[str]) -> dict:
    from data_prep.output_folder import StagingFolder, check_output_folder, clean_leftovers_beside

    clean_leftovers_beside(args.out)
    parts = check_parts([_read_part(path) for path in args.parts])
    check_output_folder(args.out, args.overwrite, inputs={"PART": args.parts})
    tokenizer = os.path.join(parts[0].path, parts[0].manifest["tokenizer"].get("file", "tokenizer.json"))
    if not os.path.isfile(tokenizer) or sha256_of(tokenizer) != parts[0].manifest["tokenizer"]["sha256"]:
        raise PrepareError(f"{parts[0]}: {tokenizer} is missing or not the tokenizer its manifest records")
    folder = StagingFolder(args.out)
    with folder as staging:
        chunks = {name: _merge_split(parts, name, staging, args.workers) for name in SPLITS}
        copy_file(tokenizer, os.path.join(staging, os.path.basename(tokenizer)))
        manifest = merged_manifest(parts, argv, chunks)
        write_manifest(staging, manifest)
        folder.commit()
    return manifest


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        manifest = merge(args, argv)
    except PrepareError as error:
        parser.error(str(error))
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    print(f"merged {len(args.parts)} parts into {args.out}: train {train['tokens']:,} tokens "
          f"({train['documents']:,} docs, {train['chunks']} chunks), val {val['tokens']:,} tokens "
          f"({val['documents']:,} docs)", file=sys.stdout)
    return 0
