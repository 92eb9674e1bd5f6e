"""`layerdrop prepare`: corpus -> tokenizer -> litdata token chunks (+ manifest.json).

Read top to bottom: parse and check every argument, resolve every source and the
tokenizer (all cheap, so bad input fails in a second with one line), keep this part's
files under ``--shard I/N`` (data_prep/shards.py), read every JSONL record once (a bad
one, or a compressed file cut short, fails before the tokenizer is trained), then in a
staging folder beside ``--out``: train the tokenizer (or copy the given one), encode
the corpus once into a flat token file, cut it into train/val by document hash,
write each split as ``TokensLoader`` chunks with litdata's ``optimize`` and write the
manifest; only then swap the staging folder into ``--out``.

``layerdrop prepare merge PART... --out DIR`` joins the folders of a sharded prepare
(data_prep/merge.py).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from data_prep.builtin_corpus import CORPORA
from data_prep.errors import PrepareError
from data_prep.given_tokenizer import GivenTokenizer
from data_prep.shards import ShardSpec, corpus_fingerprint, keep_part, parse_shard
from data_prep.sources.document import Document, Source, SourceStats
from data_prep.sources.jsonl import check_every_record
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
        epilog="Example: layerdrop prepare --corpus builtin --tokenizer train --vocab-size 8192 --out data/builtin. "
               "On N machines: layerdrop prepare ... --tokenizer FILE --shard I/N --out parts/I on each, then "
               "layerdrop prepare merge parts/* --out DIR.",
    )
    corpus = parser.add_argument_group("corpus (combine freely; read in this order)")
    corpus.add_argument("--corpus", choices=list(CORPORA),
                        help="builtin: the Python standard library sources + the man pages as plain text; "
                             "builtin:code / builtin:prose: one half alone (a tokenizer trained for a half "
                             "trains on the whole builtin corpus)")
    corpus.add_argument("--files", action="append", default=[], metavar="GLOB",
                        help="a folder, file or glob ('src/**/*.py'); every file is one document (repeatable)")
    corpus.add_argument("--jsonl", action="append", default=[], metavar="PATH",
                        help="JSON-lines file(s) (path or glob; .gz and .zst/.zstd are decompressed); one "
                             "document per line (repeatable)")
    corpus.add_argument("--text-field", default="text", metavar="NAME",
                        help="the JSONL field holding the text (default: text)")
    corpus.add_argument("--parquet", action="append", default=[], metavar="PATH",
                        help="Parquet file(s) (path or glob); one document per row (repeatable)")
    corpus.add_argument("--hf-dataset", action="append", default=[], metavar="DIR",
                        help="a Hugging Face datasets folder (save_to_disk, or a folder of .arrow/.parquet "
                             "shards); one document per row (repeatable)")
    corpus.add_argument("--text-column", default="text", metavar="NAME",
                        help="the Parquet / datasets column holding the text (default: text)")
    corpus.add_argument("--max-tokens", type=_count, metavar="N",
                        help="stop after exactly N tokens (EOS included; suffixes k, M, B)")

    tokenizer = parser.add_argument_group("tokenizer")
    tokenizer.add_argument("--tokenizer", default="train", metavar="train|PATH",
                           help="'train' a byte-level BPE on the corpus, or use a tokenizer.json, a prepared "
                                "folder's tokenizer (its EOS and document start too: the next source of a "
                                "mixture) or a Hugging Face model folder's (default: train)")
    tokenizer.add_argument("--vocab-size", type=_count, metavar="N",
                           help=f"vocabulary of the trained tokenizer (default 8192; at least {MIN_TRAINED_VOCAB})")
    tokenizer.add_argument("--eos-token", metavar="TOKEN",
                           help="the document separator (default: <|endoftext|> when training; the recorded "
                                "one of a prepared folder; the eos_token of a Hugging Face folder's "
                                "tokenizer_config.json; else the first usual EOS name the tokenizer holds)")
    tokenizer.add_argument("--document-start", choices=DOCUMENT_STARTS,
                           help="bos: each document is what the tokenizer's post-processor makes of it (BOS "
                                "first, as Hugging Face's tok(text)), then EOS; eos: documents separated by EOS "
                                "only (default: bos for a tokenizer that adds a BOS, else eos)")

    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, metavar="DIR", help="the folder to create")
    output.add_argument("--overwrite", action="store_true", help="replace --out if it already holds data")
    output.add_argument("--val-fraction", type=_fraction, default=0.01, metavar="F",
                        help="share of documents (by hash) in the val split (default: 0.01)")
    output.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed of the document hash that splits train/val")
    output.add_argument("--chunk-tokens", type=_count, default=DEFAULT_CHUNK_TOKENS, metavar="N",
                        help=f"tokens per litdata chunk (default: {DEFAULT_CHUNK_TOKENS})")
    output.add_argument("--workers", type=_count, default=min(os.cpu_count() or 1, 8), metavar="N",
                        help="worker processes for the chunk writer and threads for the tokenizer")
    output.add_argument("--shard", type=parse_shard, metavar="I/N",
                        help="prepare only the I-th of N parts of the input files (N machines or SLURM array "
                             "tasks; needs a given --tokenizer); join them with layerdrop prepare merge")
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _sources(args: argparse.Namespace) -> list[Source]:
    from data_prep.sources.columns import ParquetSource
    from data_prep.sources.files import FileSource
    from data_prep.sources.hf_dataset import HFDatasetSource
    from data_prep.sources.jsonl import JsonlSource

    sources: list[Source] = []
    if args.corpus is not None:
        from data_prep.builtin_corpus import BuiltinSource

        sources.append(BuiltinSource(corpus=args.corpus))
    sources += [FileSource(pattern) for pattern in args.files]
    sources += [JsonlSource(pattern, args.text_field) for pattern in args.jsonl]
    sources += [ParquetSource(pattern, args.text_column) for pattern in args.parquet]
    sources += [HFDatasetSource(folder, args.text_column) for folder in args.hf_dataset]
    if not sources:
        raise PrepareError("no corpus given: use --corpus builtin, --files, --jsonl, --parquet and/or --hf-dataset")
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
    if args.shard is not None and args.tokenizer == "train":
        raise PrepareError(f"--shard {args.shard} needs a given --tokenizer: every part must encode with the same "
                           "one (train it first: layerdrop prepare ... --max-tokens N --out tok, then "
                           "--tokenizer tok)")
    if args.shard is not None and args.max_tokens is not None:
        raise PrepareError(f"--max-tokens caps one prepare, not a corpus of --shard {args.shard} parts: "
                           "give one or the other")


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


@dataclass
class Inputs:
    """What the cheap checks resolved: the sources (narrowed to this part under --shard),
    the given tokenizer, and the part's record."""

    sources: list[Source]
    descriptions: list[dict]  # each source as given, before --shard narrowed it
    given: GivenTokenizer | None
    shard: dict | None


def _tokenizer_sources(sources: list[Source]) -> tuple[list[Source], bool]:
    """What a trained tokenizer learns from: the corpus, except that a builtin half
    brings the whole builtin corpus (data_prep/builtin_corpus.py says why); and whether
    that happened."""
    from data_prep.builtin_corpus import BuiltinSource

    widened = [s.tokenizer_corpus() if isinstance(s, BuiltinSource) and s.corpus != "builtin" else s for s in sources]
    return widened, any(a is not b for a, b in zip(widened, sources))


def _prepare_tokenizer(args, inputs: Inputs, staging: str) -> tuple[object, dict]:
    """Train the tokenizer or take the given one; save it as staging/tokenizer.json.

    Returns the tokenizer and its manifest entry.
    """
    from data_prep.trained_tokenizer import DEFAULT_EOS, train_tokenizer
    from framework.tokenizer import find_bos, record_for, vocab_size_of

    path = os.path.join(staging, "tokenizer.json")
    given = inputs.given
    if given is not None:
        tokenizer, eos_token, eos_id, start = given.tokenizer, given.eos_token, given.eos_id, given.document_start
        shutil.copyfile(given.path, path)  # verbatim: its sha256 matches the user's file
        entry = {"origin": given.origin}
    else:
        budget = args.max_tokens * BYTES_PER_TOKEN_ESTIMATE if args.max_tokens else None
        sources, widened = _tokenizer_sources(inputs.sources)
        seen, stats = SourceStats(), [SourceStats() for _ in sources]
        eos_token, start = args.eos_token or DEFAULT_EOS, "eos"
        _say(f"training a byte-level BPE tokenizer (vocab {args.vocab_size}, EOS {eos_token}"
             + (", on the whole builtin corpus)" if widened else ")"))
        tokenizer = train_tokenizer(_training_texts(sources, stats, budget, seen), args.vocab_size, eos_token,
                                    progress=not args.no_progress and sys.stderr.isatty())
        if seen.documents == 0:
            raise _empty_corpus(stats)
        eos_id = tokenizer.token_to_id(eos_token)
        tokenizer.save(path)
        trained_on = {"documents": seen.documents, "bytes": seen.bytes, **({"corpus": "builtin"} if widened else {})}
        entry = {"origin": "trained", "trained_on": trained_on}
    bos_token, bos_id = find_bos(tokenizer) or (None, None)
    entry.update(record_for(sha256=sha256_of(path), vocab_size=vocab_size_of(tokenizer), eos_token=eos_token,
                            eos_id=eos_id, bos_token=bos_token, bos_id=bos_id, document_start=start))
    return tokenizer, entry


def _write_splits(args, encoded, staging: str, work: str) -> dict:
    """Each split's chunks; a split without documents (only in a part of a sharded
    corpus) has no folder."""
    from data_prep.chunks import SplitChunkReader, write_split_chunks

    splits = {}
    for name, spans in encoded.split_spans(args.val_fraction, both_splits=args.shard is None).items():
        tokens = int((spans[:, 1] - spans[:, 0]).sum())
        splits[name] = {"path": name, "documents": int(len(spans)), "tokens": tokens, "chunks": 0}
        if not len(spans):
            _say(f"{name}: no documents in this part")
            continue
        spans_path = os.path.join(work, f"{name}_spans.npy")
        np.save(spans_path, spans)
        reader = SplitChunkReader(encoded.tokens_path, encoded.dtype.name, spans_path, args.chunk_tokens)
        _say(f"writing {name}: {tokens:,} tokens, {len(spans):,} documents")
        splits[name]["chunks"] = write_split_chunks(reader, tokens, os.path.join(staging, name), args.workers)
    return splits


def run(args: argparse.Namespace, argv: list[str], inputs: Inputs, staging: str) -> dict:
    """The heavy part, written inside ``staging``; returns the manifest."""
    from data_prep.encoding import encode_documents, token_dtype

    tokenizer, tokenizer_entry = _prepare_tokenizer(args, inputs, staging)
    work = os.path.join(staging, "_work")
    os.makedirs(work)
    dtype = token_dtype(tokenizer_entry["vocab_size"])
    sources = inputs.sources
    stats = [SourceStats() for _ in sources]
    _say(f"encoding the corpus ({dtype.name} tokens)" + (f", part {args.shard}" if args.shard else ""))
    encoded = encode_documents(_documents(sources, stats), tokenizer, tokenizer_entry["eos_id"], dtype,
                               args.seed, os.path.join(work, "tokens.bin"), args.max_tokens,
                               progress=not args.no_progress,
                               with_bos=tokenizer_entry["document_start"] == "bos")
    if len(encoded.doc_ends) == 0 and args.shard is None:
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
        "sources": [{**described, "read": s.as_dict()} for described, s in zip(inputs.descriptions, stats)],
        "invalid_utf8_documents": sum(s.invalid_utf8 for s in stats),
        "truncated_last_document": encoded.truncated,
        **({"shard": inputs.shard} if inputs.shard is not None else {}),
        "splits": splits,
    }


def fingerprint_options(args: argparse.Namespace) -> dict:
    """The options besides the sources and the tokenizer that decide a part's tokens and split."""
    return {"seed": args.seed, "val_fraction": args.val_fraction, "chunk_tokens": args.chunk_tokens}


def _check_inputs(args: argparse.Namespace) -> Inputs:
    """Every check that needs no heavy work (raises PrepareError or TokenizerError)."""
    from data_prep.given_tokenizer import load_given_tokenizer
    from data_prep.output_folder import check_output_folder, clean_leftovers_beside
    from framework.files.staging import is_url

    _check_tokenizer_args(args)
    if not is_url(args.out) and (removed := clean_leftovers_beside(args.out)):
        _say(f"removed {len(removed)} staging folder(s) of killed runs: {', '.join(removed)}")
    sources = _sources(args)  # resolved (paths, globs, columns), not read
    check_output_folder(args.out, args.overwrite, inputs=_input_paths(args, sources))
    given = None if args.tokenizer == "train" else load_given_tokenizer(args.tokenizer, args.eos_token,
                                                                          args.document_start)
    descriptions, shard = [source.describe() for source in sources], None
    if args.shard is not None:
        fingerprint = corpus_fingerprint(sources, fingerprint_options(args))
        shard = {**keep_part(sources, args.shard), "corpus_sha256": fingerprint}
    return Inputs(sources, descriptions, given, shard)


def _input_paths(args: argparse.Namespace, sources: list[Source]) -> dict[str, list[str]]:
    """flag -> the files it reads (a builtin corpus is read from system folders: not listed)."""
    paths: dict[str, list[str]] = {}
    for source in sources:
        if source.flag != "--corpus":
            paths.setdefault(source.flag, []).extend(source.paths)
    if args.tokenizer != "train":
        paths["--tokenizer"] = [args.tokenizer]
    return paths


def _summary(out: str, manifest: dict, seconds: float) -> str:
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    part = f" (part {manifest['shard']['index']}/{manifest['shard']['count']})" if "shard" in manifest else ""
    return (f"prepared {out}{part}: train {train['tokens']:,} tokens ({train['documents']:,} docs, "
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
        inputs = _check_inputs(args)
        # The Rust tokenizer sizes its thread pool once, from this variable.
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))
        if (records := check_every_record(inputs.sources)):
            _say(f"checked all {records:,} JSONL records")
        folder = StagingFolder(args.out)
        with folder as staging:
            manifest = run(args, argv, inputs, staging)
            write_manifest(staging, manifest)
            folder.commit()
    except (PrepareError, TokenizerError) as error:
        parser.error(str(error))  # prints "error: ..." and exits with status 2
    print(_summary(args.out, manifest, time.perf_counter() - started))
    return 0
