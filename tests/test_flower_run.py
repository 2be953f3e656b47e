"""``cosmos-pl flower-run``: the exit status and the one line, from the run's final status.

Flower's replies are stood in for here (the statuses ``flwr ls`` reports); a real SuperLink answers in
tests/test_flower_deployment.py (a run that fails and one that completes). One real ``flwr`` call checks the reply of
a run that cannot start.
"""

import subprocess

import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from cosmos_pl.flower import run as flower_run  # noqa: E402


def _fake_flwr(monkeypatch, statuses, details="ServerApp failed with exception: only 2 of 3 clients joined"):
    """``flwr run`` starts run 7; each ``flwr ls`` reports the next of ``statuses``; ``flwr log`` returns at once."""
    calls = []
    listed = iter(statuses)

    def flwr_json(args):
        calls.append(args)
        if args[0] == "run":
            return {"success": True, "run-id": "7"}
        return {"success": True, "runs": [{"run-id": "7", "status": next(listed), "status-details": details}]}

    def run(argv, **kwargs):
        calls.append(argv[3:])
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(flower_run, "_flwr_json", flwr_json)
    monkeypatch.setattr(flower_run.subprocess, "run", run)
    monkeypatch.setattr(flower_run.time, "sleep", lambda s: None)
    return calls


def test_a_completed_run_exits_0_and_passes_flwr_runs_arguments(monkeypatch, capsys):
    calls = _fake_flwr(monkeypatch, ["finished:completed"])
    assert flower_run.main([".", "cosmos", "--stream", "-c", "config='a.yaml'", "--run-config", "args='--seed 1'",
                            "--federation-config", "num-supernodes=3"]) == 0
    assert calls == [["run", ".", "cosmos", "--run-config=config='a.yaml'", "--run-config=args='--seed 1'",
                      "--federation-config=num-supernodes=3"],
                     ["log", "7", "cosmos", "--stream"], ["ls", "cosmos", "--run-id", "7"]]
    assert capsys.readouterr().out.splitlines()[-1] == "cosmos-pl: the Flower run 7 ended finished:completed"


@pytest.mark.parametrize("status", ["finished:failed", "finished:stopped"])
def test_a_run_that_did_not_complete_exits_2_with_one_line(monkeypatch, capsys, status):
    _fake_flwr(monkeypatch, [status])
    assert flower_run.main(["."]) == 2
    assert capsys.readouterr().err == (f"cosmos-pl: error: the Flower run 7 ended {status}; ServerApp failed with "
                                       "exception: only 2 of 3 clients joined (its log: flwr log 7)\n")


def test_a_log_stream_that_broke_off_waits_on_for_the_final_status(monkeypatch, capsys):
    calls = _fake_flwr(monkeypatch, ["running", "running", "finished:failed"])
    assert flower_run.main([".", "local"]) == 2
    assert [c[0] for c in calls] == ["run", "log", "ls", "log", "ls", "log", "ls"]
    assert "ended finished:failed" in capsys.readouterr().err


def test_a_run_that_cannot_start_exits_2_with_flwrs_reason(repo_root, tmp_path, monkeypatch, capsys):
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:9"\n'
                                      'insecure = true\n')
    monkeypatch.setenv("FLWR_HOME", str(home))
    assert flower_run.main([str(repo_root), "nosuch"]) == 2  # a real flwr: no such SuperLink connection
    err = capsys.readouterr().err
    assert err.startswith("cosmos-pl: error: flwr run could not start the run: ") and "'nosuch' not found" in err
    assert err.count("\n") == 1


def test_the_task_keepalive_beats_on_after_an_error_and_stops_with_the_run():
    import time

    from cosmos_pl.flower.server_app import _task_keepalive

    calls = []

    class Client:
        def SendTaskHeartbeat(self, request):  # noqa: N802 - Flower's name
            calls.append(type(request).__name__)
            if len(calls) == 1:
                raise RuntimeError("HTTP 500")  # what ends Flower's own sender for good

    class Grid:
        _runtime_client = Client()

    with _task_keepalive(Grid(), every_s=0.01):
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert calls[:3] == ["SendTaskHeartbeatRequest"] * 3
    time.sleep(0.05)
    stopped = len(calls)
    time.sleep(0.1)
    assert len(calls) == stopped  # no beat after the run
    with _task_keepalive(object()):  # flwr.simulation's grid: no runtime client, nothing to do
        pass
