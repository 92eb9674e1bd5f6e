"""`layerdrop prepare`: corpus -> tokenizer -> litdata token chunks (+ manifest.json).

Read top to bottom: parse and check every argument, resolve every source and the
tokenizer file (all cheap, so bad input fails in a second with one line), read every
JSONL record once (a bad one fails before the tokenizer is trained), then in a
staging folder beside ``--out``: train the tokenizer (or copy the given one), encode
the corpus once into a flat token file, cut it into train/val by document hash,
write each split as ``TokensLoader`` chunks with litdata's ``optimize`` and write the
manifest; only then swap the staging folder into ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import shutil
import sys
import time
from typing import Iterator

import numpy as np

from data_prep.errors import PrepareError
from data_prep.sources import (Document, FileSource, JsonlSource, ParquetSource, Source, SourceStats,
                               check_every_record)
from framework.command_parser import CommandParser
from framework.files.manifest import MANIFEST_FORMAT, sha256_of, write_manifest
from framework.tokenizer import DOCUMENT_STARTS, TokenizerError

# Bytes of text per token assumed when a --max-tokens cap decides how much text the
# tokenizer trains on (byte-level BPE with an 8k-32k vocabulary: ~3.5-4.5 on code and
# English). Only the training sample depends on it; the token cap itself is exact.
BYTES_PER_TOKEN_ESTIMATE = 4
DEFAULT_CHUNK_TOKENS = 2**21  # 4 MiB of uint16 per chunk: large reads, fine shuffling
MIN_TRAINED_VOCAB = 257  # 256 byte symbols + EOS


def _count(value: str) -> int:
    """A positive integer, optionally with a k/M/B suffix (``200k``, ``50M``)."""
    text = value.strip().replace("_", "")
    scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) * scale <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return int(digits) * scale


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0 < number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a fraction strictly between 0 and 1")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="layerdrop prepare",
        description="Corpus -> tokenizer -> litdata TokensLoader chunks (train/ and val/) + manifest.json.",
        epilog="Example: layerdrop prepare --corpus builtin --tokenizer train --vocab-size 8192 --out data/builtin",
    )
    corpus = parser.add_argument_group("corpus (combine freely; read in this order)")
    corpus.add_argument("--corpus", choices=["builtin"],
                        help="builtin: the Python standard library sources + the man pages as plain text")
    corpus.add_argument("--files", action="append", default=[], metavar="GLOB",
                        help="a folder, file or glob ('src/**/*.py'); every file is one document (repeatable)")
    corpus.add_argument("--jsonl", action="append", default=[], metavar="PATH",
                        help="JSON-lines file(s) (path or glob, .gz ok); one document per line (repeatable)")
    corpus.add_argument("--text-field", default="text", metavar="NAME", help="the JSONL field holding the text (default: text)")
    corpus.add_argument("--parquet", action="append", default=[], metavar="PATH",
                        help="Parquet file(s) (path or glob); one document per row (repeatable)")
    corpus.add_argument("--text-column", default="text", metavar="NAME", help="the Parquet column holding the text (default: text)")
    corpus.add_argument("--max-tokens", type=_count, metavar="N",
                        help="stop after exactly N tokens (EOS included; suffixes k, M, B)")

    tokenizer = parser.add_argument_group("tokenizer")
    tokenizer.add_argument("--tokenizer", default="train", metavar="train|PATH",
                           help="'train' a byte-level BPE on the corpus, or a tokenizer.json to use (default: train)")
    tokenizer.add_argument("--vocab-size", type=_count, metavar="N",
                           help=f"vocabulary of the trained tokenizer (default 8192; at least {MIN_TRAINED_VOCAB})")
    tokenizer.add_argument("--eos-token", metavar="TOKEN",
                           help="the document separator (default: <|endoftext|> when training; "
                                "for a loaded tokenizer, the first usual EOS name it holds)")
    tokenizer.add_argument("--document-start", choices=DOCUMENT_STARTS,
                           help="bos: each document is what the tokenizer's post-processor makes of it (BOS "
                                "first, as Hugging Face's tok(text)), then EOS; eos: documents separated by EOS "
                                "only (default: bos for a tokenizer that adds a BOS, else eos)")

    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, metavar="DIR", help="the folder to create")
    output.add_argument("--overwrite", action="store_true", help="replace --out if it already holds data")
    output.add_argument("--val-fraction", type=_fraction, default=0.01, metavar="F",
                        help="share of documents (by hash) in the val split (default: 0.01)")
    output.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the document hash that splits train/val")
    output.add_argument("--chunk-tokens", type=_count, default=DEFAULT_CHUNK_TOKENS, metavar="N",
                        help=f"tokens per litdata chunk (default: {DEFAULT_CHUNK_TOKENS})")
    output.add_argument("--workers", type=_count, default=min(os.cpu_count() or 1, 8), metavar="N",
                        help="worker processes for the chunk writer and threads for the tokenizer")
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _sources(args: argparse.Namespace) -> list[Source]:
    sources: list[Source] = []
    if args.corpus == "builtin":
        from data_prep.builtin_corpus import BuiltinSource

        sources.append(BuiltinSource())
    sources += [FileSource(pattern) for pattern in args.files]
    sources += [JsonlSource(pattern, args.text_field) for pattern in args.jsonl]
    sources += [ParquetSource(pattern, args.text_column) for pattern in args.parquet]
    if not sources:
        raise PrepareError("no corpus given: use --corpus builtin, --files, --jsonl and/or --parquet")
    return sources


def _check_tokenizer_args(args: argparse.Namespace) -> None:
    if args.tokenizer == "train":
        args.vocab_size = args.vocab_size or 8192
        if args.vocab_size < MIN_TRAINED_VOCAB:
            raise PrepareError(f"--vocab-size {args.vocab_size} is too small: a byte-level BPE needs at least "
                               f"{MIN_TRAINED_VOCAB} (256 bytes + EOS)")
    elif args.vocab_size is not None:
        raise PrepareError(f"--vocab-size applies to --tokenizer train only; {args.tokenizer} fixes its own")
    if args.tokenizer == "train" and args.document_start == "bos":
        raise PrepareError("--document-start bos needs a tokenizer that adds a BOS; the trained BPE has none "
                           "(allowed: eos)")


def _documents(sources: list[Source], stats: list[SourceStats]) -> Iterator[Document]:
    return itertools.chain.from_iterable(source.documents(s) for source, s in zip(sources, stats))


def _training_texts(sources: list[Source], stats: list[SourceStats], budget_bytes: int | None,
                    seen: SourceStats) -> Iterator[str]:
    for doc in _documents(sources, stats):
        seen.documents += 1
        seen.bytes += len(doc.text.encode("utf-8"))
        yield doc.text
        if budget_bytes is not None and seen.bytes >= budget_bytes:
            return


_STARTED = time.perf_counter()


def _say(message: str) -> None:
    print(f"layerdrop prepare [{time.perf_counter() - _STARTED:6.1f} s]: {message}", file=sys.stderr, flush=True)


def _empty_corpus(stats: list[SourceStats]) -> PrepareError:
    empty, binary = sum(s.skipped_empty for s in stats), sum(s.skipped_binary for s in stats)
    return PrepareError(f"the corpus is empty after filtering ({empty} empty and {binary} binary documents "
                        "skipped): nothing to tokenize")


def _prepare_tokenizer(args, sources, loaded, staging) -> tuple[object, dict]:
    """Train the tokenizer or take the loaded one; save it as staging/tokenizer.json.

    Returns the tokenizer and its manifest entry.
    """
    from data_prep.trained_tokenizer import DEFAULT_EOS, train_tokenizer
    from framework.tokenizer import find_bos, record_for, vocab_size_of

    path = os.path.join(staging, "tokenizer.json")
    if loaded is not None:
        tokenizer, eos_token, eos_id, _ = loaded
        shutil.copyfile(args.tokenizer, path)  # verbatim: its sha256 matches the user's file
        entry = {"origin": os.path.abspath(args.tokenizer)}
    else:
        budget = args.max_tokens * BYTES_PER_TOKEN_ESTIMATE if args.max_tokens else None
        seen, stats = SourceStats(), [SourceStats() for _ in sources]
        eos_token = args.eos_token or DEFAULT_EOS
        _say(f"training a byte-level BPE tokenizer (vocab {args.vocab_size}, EOS {eos_token})")
        tokenizer = train_tokenizer(_training_texts(sources, stats, budget, seen), args.vocab_size, eos_token,
                                    progress=not args.no_progress and sys.stderr.isatty())
        if seen.documents == 0:
            raise _empty_corpus(stats)
        eos_id = tokenizer.token_to_id(eos_token)
        tokenizer.save(path)
        entry = {"origin": "trained", "trained_on": {"documents": seen.documents, "bytes": seen.bytes}}
    bos_token, bos_id = find_bos(tokenizer) or (None, None)
    entry.update(record_for(sha256=sha256_of(path), vocab_size=vocab_size_of(tokenizer), eos_token=eos_token,
                            eos_id=eos_id, bos_token=bos_token, bos_id=bos_id,
                            document_start=loaded[3] if loaded is not None else "eos"))
    return tokenizer, entry


def _write_splits(args, encoded, staging: str, work: str) -> dict:
    from data_prep.chunks import SplitChunkReader, write_split_chunks

    splits = {}
    for name, spans in encoded.split_spans(args.val_fraction).items():
        spans_path = os.path.join(work, f"{name}_spans.npy")
        np.save(spans_path, spans)
        tokens = int((spans[:, 1] - spans[:, 0]).sum())
        reader = SplitChunkReader(encoded.tokens_path, encoded.dtype.name, spans_path, args.chunk_tokens)
        _say(f"writing {name}: {tokens:,} tokens, {len(spans):,} documents")
        chunks = write_split_chunks(reader, tokens, os.path.join(staging, name), args.workers)
        splits[name] = {"path": name, "documents": int(len(spans)), "tokens": tokens, "chunks": chunks}
    return splits


def run(args: argparse.Namespace, argv: list[str], sources: list[Source], loaded, staging: str) -> dict:
    """The heavy part, written inside ``staging``; returns the manifest."""
    from data_prep.encoding import encode_documents, token_dtype

    tokenizer, tokenizer_entry = _prepare_tokenizer(args, sources, loaded, staging)
    work = os.path.join(staging, "_work")
    os.makedirs(work)
    dtype = token_dtype(tokenizer_entry["vocab_size"])
    stats = [SourceStats() for _ in sources]
    _say(f"encoding the corpus ({dtype.name} tokens)")
    encoded = encode_documents(_documents(sources, stats), tokenizer, tokenizer_entry["eos_id"], dtype,
                               args.seed, os.path.join(work, "tokens.bin"), args.max_tokens,
                               progress=not args.no_progress,
                               with_bos=tokenizer_entry["document_start"] == "bos")
    if len(encoded.doc_ends) == 0:
        raise _empty_corpus(stats)
    splits = _write_splits(args, encoded, staging, work)
    shutil.rmtree(work)
    _say("done")
    return {
        "format": MANIFEST_FORMAT,
        "command": shlex.join(["layerdrop", "prepare", *argv]),
        "seed": args.seed, "val_fraction": args.val_fraction, "max_tokens": args.max_tokens,
        "chunk_tokens": args.chunk_tokens, "dtype": dtype.name,
        "tokenizer": tokenizer_entry,
        "sources": [{**source.describe(), "read": s.as_dict()} for source, s in zip(sources, stats)],
        "invalid_utf8_documents": sum(s.invalid_utf8 for s in stats),
        "truncated_last_document": encoded.truncated,
        "splits": splits,
    }


def _check_inputs(args: argparse.Namespace) -> tuple[list[Source], tuple | None]:
    """Every check that needs no heavy work (raises PrepareError).

    Returns the resolved sources and, for a tokenizer file, (tokenizer, EOS token, EOS id,
    document start).
    """
    from data_prep.output_folder import check_output_folder, clean_leftovers_beside
    from framework.files.staging import is_url

    _check_tokenizer_args(args)
    if not is_url(args.out) and (removed := clean_leftovers_beside(args.out)):
        _say(f"removed {len(removed)} staging folder(s) of killed runs: {', '.join(removed)}")
    sources = _sources(args)  # resolved (paths, globs, columns), not read
    check_output_folder(args.out, args.overwrite, inputs=_input_paths(args, sources))
    loaded = None
    if args.tokenizer != "train":
        from framework.tokenizer import default_document_start, find_bos, find_eos, load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
        start = args.document_start or default_document_start(tokenizer)
        if start == "bos" and find_bos(tokenizer) is None:
            raise PrepareError(f"--document-start bos: {args.tokenizer} adds no BOS to a text (allowed: eos)")
        loaded = (tokenizer, *find_eos(tokenizer, args.eos_token, where=args.tokenizer), start)
    return sources, loaded


def _input_paths(args: argparse.Namespace, sources: list[Source]) -> dict[str, list[str]]:
    """flag -> the files it reads (a builtin corpus is read from system folders: not listed)."""
    paths: dict[str, list[str]] = {flag: [] for flag in ("--files", "--jsonl", "--parquet")}
    for source in sources:
        kind = source.describe()["kind"]
        if kind != "builtin":
            paths[f"--{kind}"] += source.paths
    if args.tokenizer != "train":
        paths["--tokenizer"] = [args.tokenizer]
    return paths


def _summary(out: str, manifest: dict, seconds: float) -> str:
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    return (f"prepared {out}: train {train['tokens']:,} tokens ({train['documents']:,} docs, "
            f"{train['chunks']} chunks), val {val['tokens']:,} tokens ({val['documents']:,} docs); "
            f"vocab {manifest['tokenizer']['vocab_size']:,} ({manifest['dtype']}), "
            f"eos id {manifest['tokenizer']['eos_id']}, documents start with "
            f"{manifest['tokenizer']['document_start'].upper()}; {seconds:.1f} s")


def main(argv: list[str]) -> int:
    from data_prep.output_folder import StagingFolder

    global _STARTED
    parser = build_parser()
    args = parser.parse_args(argv)
    started = _STARTED = time.perf_counter()
    try:
        sources, loaded = _check_inputs(args)
        # The Rust tokenizer sizes its thread pool once, from this variable.
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))
        if (records := check_every_record(sources)):
            _say(f"checked all {records:,} JSONL records")
        folder = StagingFolder(args.out)
        with folder as staging:
            manifest = run(args, argv, sources, loaded, staging)
            write_manifest(staging, manifest)
            folder.commit()
    except (PrepareError, TokenizerError) as error:
        parser.error(str(error))  # prints "error: ..." and exits with status 2
    print(_summary(args.out, manifest, time.perf_counter() - started))
    return 0
