"""``cosmos-pl compare``: algorithms x seeds on one partition per seed, and the report (tables, figure, bytes)."""

from cosmos_pl.compare.pairs import CompareResult, run_compare
from cosmos_pl.compare.report import AlgorithmRow, PairResult, overlaps, summarize, write_report

__all__ = ["run_compare", "CompareResult", "PairResult", "AlgorithmRow", "summarize", "overlaps", "write_report"]
