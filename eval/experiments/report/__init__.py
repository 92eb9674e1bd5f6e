"""The paper's tables, verdicts and plots from a sweep folder (`layerdrop report`).

``build`` (the command: report.json, README.md, images), ``out_folder`` (where it may write),
``tables`` (every number from the run records), ``significance`` (the noise model and tests of
docs/RULES.md), ``findings/`` (the paper's claims and their verdicts), ``markdown`` (the page),
``hyperparameter_curves``, ``own_optimum`` (each configuration at its own τ_EMA, beside the same
λ), ``budget_trend`` (Fig. 8 across budgets), ``choosing`` (the choosing table), ``projection`` (a
registered projection and its judgement) and ``page_table`` (how the page prints a table).
"""
