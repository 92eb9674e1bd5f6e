"""Running a grid of pretraining runs and their evaluations.

``runner`` (`layerdrop sweep`: the Runner, its local pool), ``spec`` (the sweep file's model),
``run_folder`` (one run's folder and the stages left to run), ``adoption`` (runs finished in a
committed report's runs/ copy), ``slurm`` (the SLURM job array instead), ``dry_run`` and
``status`` (what a sweep would do, what it is doing), ``compute_matched`` (the dense baselines'
step counts), ``dotted_keys``, ``results`` (the run records a finished run leaves, as the report
reads them) and ``tune`` (`layerdrop tune`: successive 1-D sweeps on the same Runner).
"""
