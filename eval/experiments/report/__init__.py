"""The paper's tables, verdicts and plots from a sweep folder (`layerdrop report`).

``build`` (the command: report.json, README.md, images), ``out_folder`` (where it may write),
``tables`` (every number from the run records), ``significance`` (the noise model and tests of
docs/RULES.md), ``findings/`` (the paper's claims and their verdicts), ``markdown`` (the page),
``hyperparameter_curves``, ``budget_trend`` (Fig. 8 across budgets), ``choosing`` (the choosing
table) and ``projection`` (a registered projection and its judgement).
"""
