"""The experiment layer: grids of pretraining runs and the paper's tables from them.

`layerdrop sweep` (sweep, with the sweep file's model in sweep_spec, one run's folder in
run_folder, runs adopted from a committed report in sweep_adoption, the SLURM job array
in sweep_slurm) runs training and evaluation commands as subprocesses; `layerdrop tune`
(tune) drives the same runner through successive 1-D sweeps; `layerdrop report` (report,
from the run records of sweep_results, the numbers of report_tables, the verdicts of
findings, the page of report_markdown) reads what they wrote. A layer above the rest of
eval/, which it imports only for the shared flags, the held-out noise and the plots.
"""
