"""What a trained checkpoint is worth, and the experiments that compare them.

Every command here reads a checkpoint the framework wrote (or a Hugging Face folder it
imports) and never trains the backbone: the held-out loss at every exit and under skip sets
(measurements), text at the depth you choose with its cost, including self-speculative and
dynamic-exit decoding (decoding), exit adapters fitted on a frozen backbone (adapters),
lm-eval benchmarks at any exit (downstream), and the sweeps, tuning and reports that turn many
runs into the paper's tables (experiments). inputs, options and skip_sets are the argument
parsing the commands share. `framework/` never imports this package.
"""
