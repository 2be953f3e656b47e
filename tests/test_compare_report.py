"""The comparison report on made-up numbers: SEM of the per-seed means, the signed † and ‡ marks, best round,
failures, bytes."""

import csv
import math

import pytest

from cosmos_pl.compare.report import PairResult, comparison_markdown, communication_markdown, marks, overlaps, \
    paired_interval, summarize, write_report

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
    assert "| fedmd +† +‡ | client model f_i | 0,1,2 | 0.7200 ± 0.0115 |" in md  # 0.10 each seed: interval [0.1, 0.1]
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


T_975_2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (tables: 4.303)


def test_one_seed_has_no_sem_and_no_mark(tmp_path):
    pairs = [PairResult("cosmos", 0, [0.08, 0.0863], "cluster teacher h_pi(i)", COMM),
             PairResult("local", 0, [0.08, 0.0809], "client model f_i", COMM),
             PairResult("fedmd", 0, [0.08, 0.0800], "client model f_i", COMM)]
    rows = {r.algorithm: r for r in write_report(pairs, tmp_path, "one seed")}
    assert not any(r.dagger or r.paired_above_zero for r in rows.values())
    md = (tmp_path / "comparison.md").read_text()
    assert "| cosmos | cluster teacher h_pi(i) | 0 | 0.0863 ± n/a | 0.0863 ± n/a | 0.0800 ± n/a | - | - | - |" in md
    assert "| local | client model f_i | 0 | 0.0809 ± n/a | 0.0809 ± n/a | 0.0800 ± n/a | 0.0054 ± n/a | n/a | - |" in md
    assert "With fewer than 2 seeds (cosmos, local, fedmd) there is no SEM and no interval (n/a) and no mark" in md
    table_lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table_lines) == 5 and not any("†" in line or "‡" in line for line in table_lines)  # no mark
    with open(tmp_path / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert table["local"]["final_sem"] == "" and table["local"]["paired_diff_ci95_low"] == ""
    assert table["local"]["dagger"] == "0" and table["local"]["paired_above_zero"] == "0"


def test_three_seeds_paired_interval_above_zero_while_the_unpaired_intervals_overlap():
    # the partition moves both algorithms together: COSMOS 0.80, 0.70, 0.90; the baseline 0.02, 0.025, 0.015 below
    pairs = [PairResult("cosmos", s, [0.6, f], "cluster teacher h_pi(i)", COMM) for s, f in enumerate((0.80, 0.70, 0.90))]
    pairs += [PairResult("comet", s, [0.6, f], "client model f_i", COMM) for s, f in enumerate((0.78, 0.675, 0.885))]
    rows = {r.algorithm: r for r in summarize(pairs)}
    cosmos, comet = rows["cosmos"], rows["comet"]
    # unpaired: 0.80 ± 0.1/sqrt(3) = 0.0577 and 0.78 ± 0.105/sqrt(3) = 0.0606 overlap: no dagger
    assert cosmos.final["sem"] == pytest.approx(0.1 / math.sqrt(3))
    assert comet.final["sem"] == pytest.approx(0.105 / math.sqrt(3))
    assert not comet.dagger and not cosmos.dagger
    # paired: differences 0.02, 0.025, 0.015: mean 0.02, sample std 0.005, SEM 0.005 / sqrt(3) = 0.0028868;
    # 95% interval 0.02 -+ 4.3027 * 0.0028868 = [0.007579, 0.032421], above 0
    sem = 0.005 / math.sqrt(3)
    assert comet.paired["mean"] == pytest.approx(0.02) and comet.paired["sem"] == pytest.approx(sem)
    assert comet.paired["low"] == pytest.approx(0.02 - T_975_2 * sem) == pytest.approx(0.0075791, abs=1e-6)
    assert comet.paired["high"] == pytest.approx(0.0324209, abs=1e-6)
    assert comet.paired_above_zero and cosmos.paired_above_zero  # the only baseline: COSMOS gets it too
    md = comparison_markdown(list(rows.values()), "cifar10 subset")
    assert "| comet +‡ | client model f_i | 0,1,2 | 0.7800 ± 0.0606 |" in md
    assert "| 0.0200 ± 0.0029 | [+0.0076, +0.0324] |" in md
    # a spread that reaches 0: differences 0.02, 0.03, 0.01 -> SEM 0.005774, half-width 0.024841, low -0.0048
    assert paired_interval([0.02, 0.03, 0.01])["low"] == pytest.approx(0.02 - T_975_2 * 0.01 / math.sqrt(3))
    assert paired_interval([0.02, 0.03, 0.01])["low"] < 0


def test_each_mark_says_whether_cosmos_is_above_or_below_the_baseline(tmp_path):
    # COSMOS 0.70, 0.72, 0.74: mean 0.72, SEM 0.02 / sqrt(3) = 0.011547, interval [0.708453, 0.731547].
    # local above it: 0.80, 0.81, 0.82: 0.81 ± 0.005774, [0.804226, 0.815774], apart: COSMOS below (-†); paired
    #   differences -0.10, -0.09, -0.08: mean -0.09, SEM 0.005774, 95% -0.09 -+ 4.3027 * 0.005774 =
    #   [-0.114841, -0.065159], below 0 (-‡).
    # fedmd below it: 0.60, 0.62, 0.64: 0.62 ± 0.011547, [0.608453, 0.631547], apart: COSMOS above (+†); paired
    #   0.10 on every seed: [0.10, 0.10], above 0 (+‡).
    def pairs(name, finals, model="client model f_i"):
        return [PairResult(name, s, [0.5, f], model, COMM) for s, f in enumerate(finals)]

    cosmos = pairs("cosmos", (0.70, 0.72, 0.74), "cluster teacher h_pi(i)")
    local, fedmd = pairs("local", (0.80, 0.81, 0.82)), pairs("fedmd", (0.60, 0.62, 0.64))
    rows = {r.algorithm: r for r in write_report(cosmos + local + fedmd, tmp_path, "both ways")}
    assert rows["local"].dagger == -1 and rows["fedmd"].dagger == 1
    assert rows["local"].paired["high"] == pytest.approx(-0.09 + T_975_2 * 0.01 / math.sqrt(3))
    assert rows["local"].paired_below_zero and not rows["local"].paired_above_zero
    assert rows["fedmd"].paired_above_zero and not rows["fedmd"].paired_below_zero
    assert rows["cosmos"].dagger == 0 and not rows["cosmos"].paired_above_zero  # above one baseline, below the other
    md = (tmp_path / "comparison.md").read_text()
    assert "| local -† -‡ | client model f_i | 0,1,2 | 0.8100 ± 0.0058 |" in md
    assert "| [-0.1148, -0.0652] |" in md
    assert "| fedmd +† +‡ | client model f_i | 0,1,2 | 0.6200 ± 0.0115 |" in md
    assert "| cosmos | cluster teacher h_pi(i) | 0,1,2 | 0.7200 ± 0.0115 |" in md
    # the legend stands under the table
    legend = md.index("Marks, signed as COSMOS - this: +† / -† COSMOS above / below this baseline")
    assert legend > md.index("| fedmd +† +‡ |") and md.index("| algorithm |") < legend
    with open(tmp_path / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert (table["local"]["dagger"], table["local"]["paired_above_zero"], table["local"]["paired_below_zero"]) == \
        ("-1", "0", "1")
    assert (table["fedmd"]["dagger"], table["fedmd"]["paired_above_zero"], table["fedmd"]["paired_below_zero"]) == \
        ("1", "1", "0")
    # with one baseline COSMOS's row carries its marks, signed the same way (COSMOS below local-only: - on both rows)
    only = {r.algorithm: r for r in summarize(cosmos + local)}
    assert marks(only["local"]) == "-† -‡" and marks(only["cosmos"]) == "-† -‡"
    only = {r.algorithm: r for r in summarize(cosmos + fedmd)}
    assert marks(only["fedmd"]) == "+† +‡" and marks(only["cosmos"]) == "+† +‡"


def test_a_top5_headline_decides_every_number_and_mark(tmp_path):
    def pair(alg, seed, top1, top5):
        return PairResult(alg, seed, [0.05, top1], "client model f_i", COMM, rounds_top5=[0.2, top5])

    # top-1: cosmos 0.086, 0.088, 0.090 vs local 0.081, 0.083, 0.085 (apart by 0.005 each seed);
    # top-5: cosmos 0.30, 0.31, 0.32 vs local 0.30, 0.32, 0.34 (differences 0, -0.01, -0.02)
    pairs = [pair("cosmos", s, a, b) for s, a, b in ((0, 0.086, 0.30), (1, 0.088, 0.31), (2, 0.090, 0.32))]
    pairs += [pair("local", s, a, b) for s, a, b in ((0, 0.081, 0.30), (1, 0.083, 0.32), (2, 0.085, 0.34))]
    rows = {r.algorithm: r for r in write_report(pairs, tmp_path, "tiny", "top5")}
    assert rows["cosmos"].final["mean"] == pytest.approx(0.31)
    assert rows["local"].paired["mean"] == pytest.approx(-0.01) and not rows["local"].paired_above_zero
    assert rows["local"].other_final["mean"] == pytest.approx(0.083)  # top-1 beside it
    md = (tmp_path / "comparison.md").read_text()
    assert "Headline metric: top-5 accuracy." in md
    assert "| final round (top-5) | best round | local-only (round 0) | COSMOS - this | 95% interval | final round (top-1) |" in md
    assert "| cosmos | client model f_i | 0,1,2 | 0.3100 ± 0.0058 | 0.3100 ± 0.0058 | 0.2000 ± 0.0000 | - | - | 0.0880 ± 0.0012 |" in md
    with open(tmp_path / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert table["cosmos"]["headline_metric"] == "top5"
    assert float(table["cosmos"]["final_top1_mean"]) == pytest.approx(0.088)
    # in top-1 the same runs give COSMOS a paired 0.005 on every seed: above 0
    assert {r.algorithm: r for r in summarize(pairs, metric="top1")}["local"].paired_above_zero


def test_fit_final_line_reports_the_headline_metric_with_the_other_beside_it():
    from cosmos_pl.fit import final_line

    stats = lambda m, s: {"mean": m, "sem": s}  # noqa: E731
    summary = {"headline_metric": "top5", "scored_model": "cluster teacher h_pi(i)",
               "final": {"round": 3, "personalized_acc": stats(0.25, 0.01), "personalized_top5": stats(0.5, 0.02),
                         "client_acc": stats(0.2, 0.01), "client_top5": stats(0.45, 0.02)},
               "local_only": {"client_acc": stats(0.18, 0.01), "client_top5": stats(0.4, 0.02)},
               "clusters": {"K": 5, "adjusted_rand_index": 1.0}}
    assert final_line(summary, "teacher") == ("final round 3: cluster teacher h_pi(i) top-5 0.5000 ± 0.0200 (top-1 "
                                              "0.2500 ± 0.0100); client f_i top-5 0.4500; local-only (round 0) top-5 "
                                              "0.4000; K = 5, ARI = 1.0000")
    summary["clusters"]["adjusted_rand_index"] = 2 / 3  # 0.6666666666666666: printed with 4 digits, as accuracies
    assert final_line(summary, "teacher").endswith("; K = 5, ARI = 0.6667")
    summary["clusters"]["adjusted_rand_index"] = None  # no true groups (a deployment)
    assert final_line(summary, "teacher").endswith("; K = 5, ARI = n/a")
    summary["headline_metric"] = "top1"
    assert final_line(summary, "teacher").startswith("final round 3: cluster teacher h_pi(i) 0.2500 ± 0.0100 (top-5 "
                                                     "0.5000 ± 0.0200); client f_i 0.2000; local-only (round 0) 0.1800")


def test_a_top5_headline_on_fewer_than_20_classes_is_refused(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    assert main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(tmp_path / "r"),
                 "--headline_metric", "top5", "--wandb.mode", "disabled"]) == 2
    assert capsys.readouterr().err.strip() == (
        "cosmos-pl: error: headline_metric='top5': top-5 accuracy is recorded for data sets of M >= 20 classes and "
        "this one has M = 10: use top1")


def test_the_validation_column_is_the_final_rounds_validation_accuracy_over_seeds(tmp_path):
    # validation 0.85, 0.87, 0.89 in the final round (round 1's 0.99 is not the final round): 0.87 ± 0.02 / sqrt(3)
    pairs = [PairResult("cosmos", s, [0.6, 0.99, 0.8], "cluster teacher h_pi(i)", COMM, rounds_val=[0.6, 0.99, v])
             for s, v in enumerate((0.85, 0.87, 0.89))]
    pairs.append(PairResult("local", 0, [0.6, 0.7, 0.8], "client model f_i", COMM))  # no validation split
    rows = {r.algorithm: r for r in write_report(pairs, tmp_path, "val")}
    assert rows["cosmos"].val_final["mean"] == pytest.approx(0.87)
    assert rows["cosmos"].val_final["sem"] == pytest.approx(0.02 / math.sqrt(3))
    assert rows["local"].val_final is None
    md = (tmp_path / "comparison.md").read_text()
    assert "| final round (top-5) | validation (top-1) |" in md
    assert "| - | 0.8700 ± 0.0115 |" in md and "| n/a | - | - |" in md  # local: one seed, no validation
    with open(tmp_path / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert float(table["cosmos"]["final_val_top1_mean"]) == pytest.approx(0.87, abs=1e-6)
    assert table["local"]["final_val_top1_mean"] == ""


def test_the_tables_say_how_cosmos_clustered_and_when_a_seed_fell_back(tmp_path):
    # COSMOS over 3 seeds of 10 clients: seeds 0 and 2 found the 5 groups (ARI 1.0), seed 1 kept no cluster (K = N =
    # 10, weak structure, ARI 0.0); COMET's K is given (no structure to judge), local-only does not cluster.
    def cosmos(seed, k, ari, weak):
        return PairResult("cosmos", seed, [0.6, 0.7, 0.8 if k == 5 else 0.59], "cluster teacher h_pi(i)", COMM,
                          clusters={"K": k, "N": 10, "weak": weak, "ari": ari})

    pairs = [cosmos(0, 5, 1.0, False), cosmos(1, 10, 0.0, True), cosmos(2, 5, 1.0, False)]
    pairs += [PairResult("comet", s, [0.6, 0.7, 0.75], "client model f_i", COMM,
                         clusters={"K": 5, "N": 10, "weak": None, "ari": a}) for s, a in ((0, 0.8), (1, 0.6), (2, 1.0))]
    pairs += [PairResult("local", s, [0.6, 0.6, 0.6], "client model f_i", COMM) for s in range(3)]
    rows = {r.algorithm: r for r in write_report(pairs, tmp_path, "made-up")}
    assert rows["cosmos"].clustering.alone_seeds == [1] and rows["cosmos"].clustering.weak_seeds == [1]
    md = (tmp_path / "comparison.md").read_text()
    # K: mean (5 + 10 + 5) / 3 = 6.7, the weak seed starred; ARI: mean (1 + 0 + 1) / 3 = 0.67
    assert md.count("| K 6.7 (5, 10*, 5); ARI 0.67 (1.00, 0.00, 1.00) |") == 1
    assert "| K 5.0 (5, 5, 5); ARI 0.80 (0.80, 0.60, 1.00) |" in md  # COMET: (0.8 + 0.6 + 1.0) / 3
    local_line = next(line for line in md.splitlines() if line.startswith("| local"))
    assert local_line.endswith("| - |")  # no clusters column for an algorithm that does not cluster
    assert ("- cosmos, seed 1: no two clients shared a cluster (K = N): every client distilled a teacher of its own, "
            "so this row shows teachers of one client each, not cluster teachers.") in md
    assert "comet, seed" not in md  # COMET reports no structure: nothing to say
    with open(tmp_path / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert table["cosmos"]["clusters_K_per_seed"] == "5 10 5" and table["cosmos"]["clusters_alone_seeds"] == "1"
    assert table["cosmos"]["clusters_weak_seeds"] == "1"
    assert float(table["cosmos"]["clusters_K_mean"]) == pytest.approx(20 / 3)
    assert float(table["cosmos"]["clusters_ari_mean"]) == pytest.approx(2 / 3)
    assert table["local"]["clusters_K_mean"] == "" and table["local"]["clusters_ari_per_seed"] == ""
