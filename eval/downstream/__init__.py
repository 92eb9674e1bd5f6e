"""Downstream benchmarks: `layerdrop eval downstream` runs lm-evaluation-harness (harness)
on this project's model registered in it (lm_eval_adapter), with task names checked in a
second (task_index); the native multiple-choice scorer and its pretraining callback
(multiple_choice) give the same numbers in-process."""
