"""Clients sampled per round (``clients_per_round``): how many, which, and what an unsampled client does (nothing:
its model stays as it was), every client still scored; a resumed run samples the same clients."""

import csv
import json
import shutil

import pytest
import torch

from conftest import small_digits_argv
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.initial_models import seeded_backbone
from cosmos_pl.federated.sampling import check_clients_per_round, round_size, sampled_clients


def test_round_size_by_hand():
    assert round_size(None, 20) == 20
    assert round_size(3, 20) == 3
    assert round_size(0.5, 20) == 10
    assert round_size(0.5, 5) == 2  # 2.5 rounds half to even
    assert round_size(0.01, 20) == 1  # at least one
    assert round_size(1.0, 7) == 7


def test_sampled_clients_depend_on_seed_and_round_only():
    first = sampled_clients(20, 0.5, seed=0, rnd=1)
    assert len(first) == 10 == len(set(first)) and first == sorted(first) and all(0 <= i < 20 for i in first)
    assert sampled_clients(20, 0.5, seed=0, rnd=1) == first  # the same draw, e.g. after a resume
    assert sampled_clients(20, 0.5, seed=0, rnd=2) != first
    assert sampled_clients(20, 0.5, seed=1, rnd=1) != first
    assert sampled_clients(20, None, seed=0, rnd=1) == list(range(20))
    assert sampled_clients(4, 4, seed=0, rnd=3) == [0, 1, 2, 3]


@pytest.mark.parametrize("value, message", [
    (0, "clients_per_round=0: a count must be 1..data.num_clients=20"),
    (21, "clients_per_round=21: a count must be 1..data.num_clients=20"),
    (0.0, "clients_per_round=0.0: a fraction must be in (0, 1]"),
    (1.5, "clients_per_round=1.5: a fraction must be in (0, 1]"),
    (True, "clients_per_round=True: give a count (e.g. 10), a fraction (e.g. 0.5) or null"),
])
def test_bad_clients_per_round_is_one_line_naming_the_value(value, message):
    with pytest.raises(ConfigError) as err:
        check_clients_per_round(value, 20)
    assert str(err.value).startswith(message)


def _rows(path):
    return list(csv.DictReader(path.open()))


@pytest.mark.slow  # two small digits runs
def test_unsampled_clients_keep_their_model_every_client_is_scored_and_a_resume_samples_the_same(repo_root, tmp_path):
    from cosmos_pl.cli import main

    run = tmp_path / "run"
    assert main(small_digits_argv(repo_root, run, "--clients_per_round", "0.5")) == 0  # 5 clients: 2 a round
    clients, metrics = _rows(run / "clients.csv"), _rows(run / "metrics.csv")
    for rnd in (1, 2):
        rows = [r for r in clients if r["round"] == str(rnd)]
        took = [int(r["client"]) for r in rows if r["took_part"] == "True"]
        assert took == sampled_clients(5, 0.5, seed=0, rnd=rnd)
        assert len(rows) == 5 and all(r["client_acc"] != "" for r in rows)  # every client scored
    assert [r["clients_in_round"] for r in metrics] == ["", "2", "2"]
    # bytes: per client that took part in a round; the totals a mean over all 5 (2 of 5 in each of 2 rounds)
    comm = json.loads((run / "summary.json").read_text())["communication"]
    per_round = comm["public_samples"] * comm["num_classes"] * 4  # float32 pseudo-labels on U
    assert comm["upload_bytes_per_client_per_round"] == per_round
    assert comm["upload_bytes_per_client_total"] == round(per_round * 2 * 2 / 5)
    # the clients not sampled in round 2 have the very weights they had after round 1
    before, after = (torch.load(run / "checkpoints" / f"round-000{r}.pt", weights_only=True)["clients"]["models"]
                     for r in (1, 2))
    for i in range(5):
        same = all(torch.equal(before[i][k], after[i][k]) for k in before[i])
        assert same == (i not in sampled_clients(5, 0.5, seed=0, rnd=2)), i

    # the run stopped after round 1 (its last checkpoint and results gone) and resumed: round 2 samples the same
    # clients and every record is as before
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    (resumed / "checkpoints" / "round-0002.pt").unlink()
    (resumed / "summary.json").unlink()
    assert main(["fit", "--resume", str(resumed)]) == 0
    for name in ("metrics.csv", "clients.csv"):
        assert (resumed / name).read_text() == (run / name).read_text(), name


@pytest.mark.slow  # a small digits run
def test_fedavg_with_sampled_clients_leaves_every_client_holding_the_global_model(repo_root, tmp_path, monkeypatch):
    from cosmos_pl.cli import main
    from cosmos_pl.federated import runner

    built = []  # the server's reference backbone (the shapes an upload must have): once for the one architecture,
    monkeypatch.setattr(runner, "seeded_backbone",  # not once per upload (2 rounds x 2 clients)
                        lambda *args: built.append(args[0]) or seeded_backbone(*args))
    run = tmp_path / "fedavg"
    assert main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithm", "FedAvg",
                 "--clients.backbones", "[test_efficientnet]", "--rounds", "2", "--data.num_clients", "5",
                 "--clients.pretrain_epochs", "1", "--clients_per_round", "2", "--executor.threads_per_worker", "1",
                 "--run_dir", str(run)]) == 0
    models = torch.load(run / "checkpoints" / "round-0002.pt", weights_only=True)["clients"]["models"]
    for key, value in models[0].items():  # the average of the 2 sampled clients, held by all 5 (the next sampled
        if value.is_floating_point():     # ones train from it)
            assert all(torch.equal(m[key], value) for m in models[1:]), key
    took = [r for r in _rows(run / "clients.csv") if r["round"] == "2" and r["took_part"] == "True"]
    assert [int(r["client"]) for r in took] == sampled_clients(5, 2, seed=0, rnd=2)
    assert built == ["test_efficientnet"]
