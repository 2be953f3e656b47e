"""benchmarks/peers: every adapter is fed the one partition ``cosmos-pl export-partition`` writes (same clients,
sizes, classes and images), ``cosmos-pl fit`` runs with the benchmark's settings, and the driver's ratios are
cosmos-pl's figure over the peer's. The benchmark itself is not run here (it is a benchmark, minutes long)."""

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"
sys.path.insert(0, str(PEERS))

import compare_peers  # noqa: E402
import cosmos_adapter  # noqa: E402
import flbench_adapter  # noqa: E402
import flower_adapter  # noqa: E402
from spec import Spec, load_partition  # noqa: E402

# a spec away from every default, so that a flag the cosmos-pl adapter fails to pass shows
SPEC = Spec(rounds=3, local_epochs=2, digest_epochs=3, batch_size=16, lr=0.01, backbone="lcnet_050", threads=1, seed=1)


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()[:16]


def _view(x_train, y_train, x_test, y_test):
    return len(y_train), len(y_test), tuple(sorted(set(np.asarray(y_train).tolist()))), _digest(x_train, y_train,
                                                                                             x_test, y_test)


@pytest.fixture(scope="module")
def partition(repo_root, tmp_path_factory):
    from cosmos_pl.cli import main

    out = tmp_path_factory.mktemp("peers") / "partition"
    assert main(cosmos_adapter.export_args(SPEC, out)) == 0
    return out


def test_every_adapter_is_fed_the_exported_partition(partition, tmp_path, monkeypatch, repo_root):
    clients, public, classes = load_partition(partition)
    files = [_view(c.x_train, c.y_train, c.x_test, c.y_test) for c in clients]
    # the federation's numbers worked out from benchmarks/peers/federation.yaml: a 4,000-image subset, U = 20% of it
    # (800), no validation split, so the 10 clients hold 3,200 training images; 500 test images each
    assert len(files) == 10 and len(public) == 800 and len(classes) == 10
    assert sum(v[0] for v in files) == 4000 - 800 and all(v[1] == 500 for v in files)

    # cosmos-pl: the federation `fit` builds from the adapter's own arguments
    from cosmos_pl.parsers import build_fit_parser

    monkeypatch.chdir(repo_root)  # the config's data root is relative to the repository
    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_args(cosmos_adapter.fit_args(SPEC, "fedmd", tmp_path / "run")[1:]))
    _, federation = init.data.build(init.seed)
    fit_view = [_view(c.x, c.y, c.x_test, c.y_test) for c in federation.clients]
    assert fit_view == files
    assert np.array_equal(federation.public.numpy(), public)
    c = init.clients
    assert (c.backbones, c.local_epochs, c.distill_epochs, c.batch_size, c.pretrain_epochs) == (["lcnet_050"], 2, 3,
                                                                                                16, 0)
    assert c.optimizer([torch.zeros(1, requires_grad=True)]).defaults["lr"] == 0.01
    assert (init.rounds, init.seed, init.executor.threads_per_worker) == (3, 1, 1)
    assert type(init.algorithm).__name__ == "FedMD"

    # Flower: what each virtual SuperNode loads by its partition-id
    flower = [flower_adapter._client(str(partition), i)[0] for i in range(len(clients))]
    assert [_view(d.x_train, d.y_train, d.x_test, d.y_test) for d in flower] == files

    # FL-bench: the files written in its layout, read back the way it indexes them (no FL-bench checkout needed)
    flbench_adapter.write_flbench_data(partition, tmp_path / "flb")
    assert flbench_adapter.client_views(tmp_path / "flb") == [v[:3] for v in files]


def test_ratios_are_cosmos_pl_over_the_peer():
    rows = [{"system": "cosmos-pl", "algorithm": "fedavg", "round_s": 3.0, "first_round_s": 10.0,
             "peak_pss_mib": 1000.0, "accuracy": 0.70},
            {"system": "Flower", "algorithm": "fedavg", "round_s": 4.0, "first_round_s": 20.0,
             "peak_pss_mib": 2000.0, "accuracy": 0.69},
            {"system": "FL-bench", "algorithm": "fedmd", "error": "exit 1: no hydra"}]
    assert compare_peers.ratios(rows) == {"Flower fedavg": {"round_ratio": 0.75, "first_round_ratio": 0.5,
                                                        "peak_pss_ratio": 0.5, "accuracy_diff": 0.01}}


def test_repeats_give_median_times_largest_memory_and_per_run_ratios():
    def run(system, round_s, pss):
        return {"system": system, "algorithm": "fedavg", "round_s": round_s, "first_round_s": 10.0, "wall_s": 60.0,
                "peak_rss_mib": pss, "peak_pss_mib": pss, "accuracy": 0.7, "payload_bytes_per_round": 8e6,
                "bytes_per_round": 8e6}

    ours = compare_peers.combine([run("cosmos-pl", 5.0, 900.0), run("cosmos-pl", 6.0, 1000.0),
                                  run("cosmos-pl", 4.0, 950.0)])
    peer = compare_peers.combine([run("FL-bench", 4.0, 800.0), run("FL-bench", 8.0, 800.0),
                                  run("FL-bench", 5.0, 800.0)])
    assert (ours["round_s"], ours["peak_pss_mib"], ours["round_s_runs"]) == (5.0, 1000.0, [5.0, 6.0, 4.0])
    assert "accuracy_runs" not in ours  # every run reached the same accuracy
    # medians 5.0 / 5.0; run by run 5/4, 6/8, 4/5
    got = compare_peers.ratios([ours, peer])["FL-bench fedavg"]
    assert (got["round_ratio"], got["round_ratio_runs"], got["peak_pss_ratio"]) == (1.0, [1.25, 0.75, 0.8], 1.25)
    assert "| FL-bench | fedavg | 5.00 | 1.00 (0.75-1.25) |" in compare_peers.table([ours, peer])
