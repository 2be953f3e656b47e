"""`cosmos-pl compare` on digits: two algorithms x two seeds, every file it writes, and a rerun that skips."""

import csv
import json
import shutil

import pytest

from cosmos_pl.cli import main

# small enough for CI: one round, 5 clients, one epoch per stage, two pairs side by side with one thread each
FAST = ["--rounds", "1", "--data.num_clients", "5", "--clients.pretrain_epochs", "1", "--algorithm.ptc_epochs", "1",
        "--algorithm.teacher_epochs", "1", "--wandb.mode", "disabled"]


pytestmark = pytest.mark.slow  # every test here reads one compare of 4 pairs, each a fit process


@pytest.fixture(scope="module")
def compared(repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    argv = ["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "cosmos,fedmd",
            "--seeds", "0,1", "--jobs", "2", "--out", str(out), *FAST]
    assert main(argv) == 0
    return out, argv


def test_every_pair_and_report_file_is_written(compared):
    out, _ = compared
    for name in ("cosmos-seed0", "cosmos-seed1", "fedmd-seed0", "fedmd-seed1"):
        run = out / "runs" / name
        for f in ("pair.yaml", "config.yaml", "partition.json", "metrics.csv", "clients.csv", "summary.json", "log.txt"):
            assert (run / f).is_file(), (name, f)
    for f in ("comparison.md", "comparison.csv", "communication.md", "accuracy_vs_round.png"):
        assert (out / f).is_file(), f


def test_pairs_of_a_seed_share_the_partition_and_round_zero(compared):
    out, _ = compared
    for seed in (0, 1):
        a, b = (out / "runs" / f"{alg}-seed{seed}" for alg in ("cosmos", "fedmd"))
        assert (a / "partition.json").read_text() == (b / "partition.json").read_text()
        rows = [list(csv.DictReader(open(d / "metrics.csv"))) for d in (a, b)]
        assert rows[0][0]["client_acc_mean"] == rows[1][0]["client_acc_mean"]  # same round-0 local-only models


def test_report_numbers_come_from_the_pairs(compared):
    out, _ = compared
    finals = {}
    for alg in ("cosmos", "fedmd"):
        finals[alg] = [json.loads((out / "runs" / f"{alg}-seed{s}" / "summary.json").read_text())["final"]
                       ["personalized_acc"]["mean"] for s in (0, 1)]
    with open(out / "comparison.csv") as f:
        table = {r["algorithm"]: r for r in csv.DictReader(f)}
    for alg, values in finals.items():
        assert float(table[alg]["final_mean"]) == pytest.approx(sum(values) / 2, abs=1e-6)
        assert float(table[alg]["final_sem"]) == pytest.approx(abs(values[0] - values[1]) / 2, abs=1e-6)
    assert table["cosmos"]["scored_model"] == "cluster teacher h_pi(i)"
    assert table["fedmd"]["scored_model"] == "client model f_i"
    comm = (out / "communication.md").read_text()
    assert "| cosmos | 1 |" in comm and "| fedmd | 1 |" in comm


def test_rerun_skips_finished_pairs(compared, capsys):
    out, argv = compared
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}
    capsys.readouterr()
    assert main(argv) == 0
    assert "4 already finished" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}


def test_a_finished_pair_with_another_config_is_an_error(compared, capsys):
    out, argv = compared
    assert main([*argv, "--clients.batch_size", "16"]) == 2
    assert "different config" in capsys.readouterr().err


def test_bad_names_fail_before_any_pair_runs(repo_root, tmp_path, capsys):
    cfg = str(repo_root / "configs/digits_smoke.yaml")
    assert main(["compare", "--config", cfg, "--algorithms", "cosmos,fedmdd", "--out", str(tmp_path / "x")]) == 2
    assert "did you mean 'fedmd'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["compare", "--config", cfg, "--algorithms", "fedavg", "--out", str(tmp_path / "y")]) == 2
    assert "same backbone" in capsys.readouterr().err


def test_an_interrupted_pair_resumes_from_its_last_round(compared, tmp_path, capsys):
    """A pair stopped after round 0 (its round-1 checkpoint and summary missing) continues from round 0's
    checkpoint on the next compare, with the same numbers; finished pairs are not touched."""
    out, argv = compared
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    pair = copy / "runs" / "cosmos-seed0"
    (pair / "summary.json").unlink()
    (pair / "checkpoints" / "round-0001.pt").unlink()
    at = argv.index("--out")
    assert main([*argv[:at], "--out", str(copy), *argv[at + 2:]]) == 0
    assert "3 already finished" in capsys.readouterr().out
    assert "resumed after round 0" in (pair / "log.txt").read_text()
    original = out / "runs" / "cosmos-seed0"
    for name in ("metrics.csv", "clients.csv"):
        assert (pair / name).read_bytes() == (original / name).read_bytes(), name
