"""Failing clients: a run survives every kind of client failure, records each with its
reason, and the other clients' numbers equal those of a run in which the faulty clients sat those rounds out.

Failures are injected through the test-only hook ``COSMOS_PL_TEST_FAULTS`` (``tests/hooks/fault_injection.py``,
installed by the ``injected_faults`` fixture). Both runs are in this process (``executor.kind sequential``): a task
that kills its worker process (the fault kind ``kill``) needs the parallel executor, whose worker start-ups and
replacements (the hung worker's and the killed one's) cost more than the two runs; that kind, and the parallel
executor's own handling of a hang, are tests/test_executor.py's
(``test_failing_tasks_are_reported_and_the_others_finish[parallel]``: the reason "worker process running it died
(exit code -9)", the other tasks' results, both workers replaced and the pool working after).
"""

import csv
import io
import json

import pytest

from cosmos_pl.cli import run
from cosmos_pl.federated.failures import ClientFailed, RoundFailed

# round 1 (PTC): six clients send malformed uploads; round 2 (IFFT): three fail in local training, each differently
UPLOAD_FAULTS = {0: "shape", 1: "dtype", 2: "nan_values", 3: "negative", 4: "row_sum", 5: "fingerprint"}
TASK_FAULTS = {4: "raise", 5: "nan", 6: "hang"}
FAULTS = ([{"round": 1, "client": c, "step": "upload", "kind": k} for c, k in UPLOAD_FAULTS.items()]
          + [{"round": 2, "client": c, "step": "local training", "kind": k} for c, k in TASK_FAULTS.items()])
LEFT_OUT = [{"round": f["round"], "client": f["client"], "step": "round", "kind": "drop"} for f in FAULTS]
REASONS = {
    (1, 0): "rejected: shape [268, 10], expected [269, 10]", (1, 1): "rejected: values have dtype torch.float64",
    (1, 2): "rejected: 1 values are NaN or inf", (1, 3): "rejected: 1 values are negative",
    (1, 4): "rows do not sum to 1", (1, 5): "rejected: public-set fingerprint 0000000000000000 does not match",
    (2, 4): "RuntimeError: injected fault", (2, 5): "DivergenceError", (2, 6): "ran past failures.timeout_s = 20 s",
}


def _argv(repo_root, run_dir, *extra):
    return ["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(run_dir),
            "--rounds", "2", "--data.num_clients", "8", "--clients.pretrain_epochs", "1",
            "--algorithm.init_args.ptc_epochs", "1", "--algorithm.init_args.teacher_epochs", "1",
            "--wandb.mode", "disabled", "--executor.threads_per_worker", "1", "--failures.min_fraction", "0.2", *extra]


def _rows(path):
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _without(rows, *columns):
    return [{k: v for k, v in r.items() if k not in columns} for r in rows]


@pytest.mark.slow
def test_every_failure_kind_is_survived_recorded_and_leaves_the_others_as_if_left_out(repo_root, tmp_path,
                                                                                     monkeypatch, injected_faults):
    faulty, left_out = tmp_path / "faulty", tmp_path / "left_out"
    # in this process (the hang is stopped by the sequential executor's alarm), as the left-out run
    monkeypatch.setenv("COSMOS_PL_TEST_FAULTS", json.dumps(FAULTS))
    summary = run(_argv(repo_root, faulty, "--executor.kind", "sequential", "--failures.timeout_s", "20"))
    monkeypatch.setenv("COSMOS_PL_TEST_FAULTS", json.dumps(LEFT_OUT))
    run(_argv(repo_root, left_out))

    recorded = {(f["round"], f["client"]): f for f in summary["failures"]}
    assert set(recorded) == set(REASONS)
    for key, reason in REASONS.items():
        assert reason in recorded[key]["reason"], (key, recorded[key])
        assert recorded[key]["step"] == ("upload" if key[0] == 1 else "local training")
    rows = _rows(faulty / "clients.csv")
    failed = {(int(r["round"]), int(r["client"])): (r["failed_step"], r["failure"]) for r in rows if r["failure"]}
    assert failed == {k: (f["step"], f["reason"]) for k, f in recorded.items()}
    assert [int(r["failed_clients"]) for r in _rows(faulty / "metrics.csv")] == [0, 6, 3]

    # every number of every client (the faulty ones kept their round-start models) equals the left-out run's
    assert _without(rows, "failed_step", "failure") == _without(_rows(left_out / "clients.csv"), "failed_step", "failure")
    assert _without(_rows(faulty / "metrics.csv"), "failed_clients") == \
        _without(_rows(left_out / "metrics.csv"), "failed_clients")


def test_abort_stops_at_the_first_failure_and_keeps_the_last_round(repo_root, tmp_path, monkeypatch, injected_faults):
    monkeypatch.setenv("COSMOS_PL_TEST_FAULTS", json.dumps([{"round": 1, "client": 2, "step": "pseudo-labels",
                                                             "kind": "raise"}]))
    with pytest.raises(ClientFailed, match=r"round 1: client 2 failed in pseudo-labels .*rounds 0..0 are saved.*"
                                           r"cosmos-pl fit --resume"):
        run(_argv(repo_root, tmp_path / "run", "--failures.on_error", "abort", "--data.num_clients", "5"))
    assert (tmp_path / "run" / "checkpoints" / "round-0000.pt").exists()


def test_too_few_clients_left_stops_the_round_uncommitted(repo_root, tmp_path, monkeypatch, injected_faults):
    monkeypatch.setenv("COSMOS_PL_TEST_FAULTS", json.dumps(
        [{"round": 1, "client": c, "step": "pseudo-labels", "kind": "raise"} for c in (0, 1, 2)]))
    with pytest.raises(RoundFailed, match=r"round 1: only 2 of 5 clients finished it \(failures.min_fraction = 0.5\)"):
        run(_argv(repo_root, tmp_path / "run", "--failures.min_fraction", "0.5", "--data.num_clients", "5"))
    assert [r["round"] for r in _rows(tmp_path / "run" / "metrics.csv")] == ["0"]  # round 1 not committed
    assert not (tmp_path / "run" / "checkpoints" / "round-0001.pt").exists()
