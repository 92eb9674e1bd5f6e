"""Where documents come from: one module per input form.

``document``   what every source yields (Document) and counts (SourceStats)
``paths``      a path, folder or glob -> the files it names
``files``      text/code files, one document each (``--files``)
``compressed`` a file as the bytes it holds: plain, gzip or zstandard, checked whole
``jsonl``      JSON lines, plain/.gz/.zst (``--jsonl``)
``columns``    a string column of Parquet files (``--parquet``) and of Arrow/Parquet shards
``hf_dataset`` a Hugging Face ``datasets`` folder (``--hf-dataset``)

Every source is resolved (paths exist, globs match, columns exist and hold strings) when
it is built, so bad input fails before any tokenizer training or encoding. Its
``documents(stats)`` generator yields the documents in a deterministic order; ``paths``
lists the files it reads in that order and ``keep(positions)`` narrows it to some of
them (``prepare --shard``). The built-in corpus is a source too (data_prep/builtin_corpus.py).
"""
