"""The Lightning callbacks that write a run's checkpoints (the forms, readers and writers
they use are framework/checkpoint/'s, which knows no Lightning):

    saving.py           PeriodicCheckpoint, AtomicCheckpointIO: checkpoints on a schedule,
                        published crash-safely, within the disk's room
    keep_tokenizer.py   KeepTokenizer: the run's tokenizer beside its checkpoints
    final_export.py     the export every run ends with (export_callbacks)
"""
