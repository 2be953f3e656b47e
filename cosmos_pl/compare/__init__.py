"""``cosmos-pl compare``: algorithms x seeds on one partition per seed, and the report (tables, figure, bytes).

The folder holds the command (:mod:`~cosmos_pl.compare.command`: :func:`run_compare`, which turns the config into
one plan), the plan (:mod:`~cosmos_pl.compare.plan`: the pairs with their configs, round-0 and W&B groups, the grid's
points, the Slurm settings; what the launchers and the report read), the pairs
(:mod:`~cosmos_pl.compare.pairs`: each (algorithm, seed) pair's config, its ``cosmos-pl fit`` process, its
records), the settings grid (:mod:`~cosmos_pl.compare.grid`: ``--grid``'s points and the grid's report) and the
report (:mod:`~cosmos_pl.compare.report`: the tables, the † and ‡ marks, the figure, the bytes), the Slurm launcher
(:mod:`~cosmos_pl.compare.slurm`: each pair a job, round 0 a job per seed, requeue and resume) and the comparison in
W&B (:mod:`~cosmos_pl.compare.wandb_runs`: the pairs' group and job type, the table run). The pairs and the grid
do not import each other; both read the plan, and the command uses both.
"""

from cosmos_pl.compare.command import CompareResult, run_compare
from cosmos_pl.compare.report import AlgorithmRow, PairResult, overlaps, summarize, write_report

__all__ = ["run_compare", "CompareResult", "PairResult", "AlgorithmRow", "summarize", "overlaps", "write_report"]
