"""What a `layerdrop` command prints besides its result: the progress of a long loop
(``loop_progress.py``), the progress line a pretraining run writes into its log and its
parser (``progress_line.py``), and the library messages no user can act on, kept out
(``library_noise.py``). Standard library (and rich) only, low in the layers
(docs/layers.md): the eval commands and the training loop both use it, and neither
needs the other to do so.
"""
