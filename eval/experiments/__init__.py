"""The experiment layer: grids of pretraining runs and the paper's tables from them.

``sweep/`` runs them: `layerdrop sweep` (sweep/runner.py) and `layerdrop tune` (sweep/tune.py)
run training and evaluation commands as subprocesses, from the sweep file's model (sweep/spec.py)
into run folders (sweep/run_folder.py), and sweep/results.py reads the run records back.
``report/`` reads what they wrote: `layerdrop report` (report/build.py), with the numbers of
report/tables.py, the verdicts of report/findings/ and the page of report/markdown.py.
``report`` imports ``sweep`` (the records, the spec), never the reverse. A layer above the rest
of eval/, which it imports only for the shared flags, the held-out noise and the plots.
"""
