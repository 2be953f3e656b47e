"""The comparison report on made-up numbers: SEM of the per-seed means, † marks, best round, failures, bytes."""

import csv
import math

import pytest

from cosmos_pl.compare.report import PairResult, comparison_markdown, communication_markdown, overlaps, summarize, \
    write_report

COMM = {"rounds": 2, "upload_bytes_per_client_per_round": 100, "download_bytes_per_client_per_round": 50,
        "upload_bytes_per_client_total": 200, "download_bytes_per_client_total": 100,
        "parameter_bytes_per_client": [1000, 3000]}


def _pairs():
    # rounds = per-round mean personalized accuracy (round 0 first)
    out = [PairResult("cosmos", s, [0.6, r1, fin], "cluster teacher h_pi(i)", COMM)
           for s, r1, fin in ((0, 0.90, 0.80), (1, 0.70, 0.82), (2, 0.70, 0.84))]
    out += [PairResult("fedmd", s, [0.6, 0.65, fin], "client model f_i", COMM) for s, fin in ((0, 0.70), (1, 0.72), (2, 0.74))]
    out += [PairResult("local", s, [0.6, 0.7, fin], "client model f_i", COMM) for s, fin in ((0, 0.81), (1, 0.83), (2, 0.82))]
    out.append(PairResult("comet", 0, error="exit status 1: boom"))
    return out


def test_overlap_of_sem_intervals():
    assert overlaps({"mean": 0.8, "sem": 0.05}, {"mean": 0.7, "sem": 0.05})  # they touch at 0.75
    assert not overlaps({"mean": 0.8, "sem": 0.04}, {"mean": 0.7, "sem": 0.05})


def test_sem_of_per_seed_means_and_daggers():
    rows = {r.algorithm: r for r in summarize(_pairs())}
    cosmos, fedmd, local = rows["cosmos"], rows["fedmd"], rows["local"]
    # final: mean(0.80, 0.82, 0.84) = 0.82; sample std 0.02, SEM 0.02 / sqrt(3)
    assert cosmos.final["mean"] == pytest.approx(0.82)
    assert cosmos.final["sem"] == pytest.approx(0.02 / math.sqrt(3))
    # best round per seed: 0.90, 0.82, 0.84 -> mean 0.853333, sample std 0.041633, SEM 0.024037
    assert cosmos.best["mean"] == pytest.approx((0.90 + 0.82 + 0.84) / 3)
    assert local.final["sem"] == pytest.approx(0.01 / math.sqrt(3))
    assert fedmd.dagger and not local.dagger  # [0.7085, 0.7315] vs [0.8085, 0.8315]: apart; local overlaps
    assert not cosmos.dagger  # local overlaps COSMOS
    assert rows["comet"].failed == ["seed 0: exit status 1: boom"] and not rows["comet"].seeds
    # paired by seed: local's differences are 0.80-0.81, 0.82-0.83, 0.84-0.82 = -0.01, -0.01, 0.02
    assert local.paired["mean"] == pytest.approx(0.0)
    assert local.paired["sem"] == pytest.approx(math.sqrt(((0.01 ** 2) * 2 + 0.02 ** 2) / 2) / math.sqrt(3))
    # fedmd: 0.10 every seed -> SEM 0; COSMOS itself and failed-only rows have none
    assert fedmd.paired["mean"] == pytest.approx(0.10) and fedmd.paired["sem"] == pytest.approx(0.0, abs=1e-12)
    assert cosmos.paired is None and rows["comet"].paired is None


def test_markdown_csv_and_communication(tmp_path):
    pairs = _pairs()
    rows = write_report(pairs, tmp_path, "made-up")
    md = (tmp_path / "comparison.md").read_text()
    assert "| fedmd † | client model f_i | 0,1,2 | 0.7200 ± 0.0115 |" in md
    assert "| cosmos | cluster teacher h_pi(i) | 0,1,2 | 0.8200 ± 0.0115 | 0.8533 ± 0.0240 | 0.6000 ± 0.0000 | - |" in md
    assert "| 0.6000 ± 0.0000 | 0.1000 ± 0.0000 |" in md  # the fedmd row's paired difference
    assert "comet, seed 0: exit status 1: boom" in md
    assert md == comparison_markdown(rows, "made-up")
    with open(tmp_path / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert table["fedmd"]["dagger"] == "1" and table["local"]["dagger"] == "0"
    assert float(table["cosmos"]["final_mean"]) == pytest.approx(0.82, abs=1e-6)
    assert float(table["fedmd"]["paired_diff_mean"]) == pytest.approx(0.10, abs=1e-6)
    assert table["comet"]["failed_pairs"] == "1" and table["comet"]["final_mean"] == ""
    comm = (tmp_path / "communication.md").read_text()
    # total 200 + 100 = 300; FedAvg: 2 rounds x 2 ways x mean(1000, 3000) = 8000
    assert "| cosmos | 2 | 100 | 50 | 300 | 8,000 |" in comm
    assert comm == communication_markdown(pairs)
    assert (tmp_path / "accuracy_vs_round.png").stat().st_size > 1000
