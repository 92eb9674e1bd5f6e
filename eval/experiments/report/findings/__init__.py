"""The paper's findings, each tested at the paper's own setting on a sweep's configurations:
``claims.py`` (the loss a configuration trains to, and ``all_findings``), ``inference.py``
(early exit, layer skipping, speculative decoding), ``verdicts.py`` (how comparisons become a
verdict, and Holm's adjustment over the page) and ``paper.py`` (the paper's own numbers).
The comparisons' statistics are eval/experiments/report/significance.py's.
"""

from eval.experiments.report.findings.claims import all_findings
from eval.experiments.report.findings.verdicts import holm_adjust, verdict

__all__ = ["all_findings", "holm_adjust", "verdict"]
