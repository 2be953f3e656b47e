"""SIGTERM and SIGINT are never lost (cosmos_pl.signals): a stop whose exception Python drops still stops the run.

A signal's handler runs wherever the main thread is; inside a finalizer run by the cyclic gc (as when a signal lands
while the gc frees a Lightning Trainer) its exception is printed as "Exception ignored" and dropped. ``_lose``
delivers a real signal exactly there. The end-to-end test is the case that ended a run with exit 0: the stop lost
inside a Lightning stage, and Lightning's own SIGTERMException (a SystemExit without a code) escaping instead.
"""

import gc
import os
import signal

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from cosmos_pl import cli, signals
from cosmos_pl.execution.executor import Executor, ExecutorConfig
from cosmos_pl.objectives import distill as distill_objective
from cosmos_pl.objectives.local_fit import fit_supervised
from cosmos_pl.training import engine
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.module import default_optimizer
from cosmos_pl.signals import Interrupted


class _Cycle:
    """Garbage only the cyclic gc frees; its finalizer runs ``action``."""

    def __init__(self, action):
        self.me, self.action = self, action

    def __del__(self):
        self.action()


def _lose(sig: int) -> None:
    """Send ``sig`` to this process from inside a finalizer run by the gc: its handler runs there, and Python drops
    the handler's exception."""
    _Cycle(lambda: os.kill(os.getpid(), sig))
    gc.collect()


@pytest.fixture
def armed():
    previous = signals.install()
    yield previous
    signals.restore(previous)


def test_a_stop_lost_in_a_finalizer_is_recorded_and_raised_at_the_next_check(armed, capsys):
    signals.check()  # nothing requested: a no-op
    _lose(signal.SIGTERM)  # returns normally: the exception was dropped
    assert signals.requested() == signal.SIGTERM
    assert capsys.readouterr().err == ""  # the dropped Interrupted is not printed as "Exception ignored"
    with pytest.raises(Interrupted) as err:
        signals.check()
    assert err.value.signum == signal.SIGTERM and str(err.value) == "SIGTERM"


def test_restore_puts_back_the_handlers_and_forgets_the_stop(capsys):
    before = signal.getsignal(signal.SIGTERM)
    previous = signals.install()
    assert signal.getsignal(signal.SIGTERM) is signals.handler and signal.getsignal(signal.SIGINT) is signals.handler
    _lose(signal.SIGINT)
    signals.restore(previous)
    assert signal.getsignal(signal.SIGTERM) is before and signals.requested() is None
    signals.check()  # disarmed: never raises


def test_a_second_signal_is_only_recorded_while_the_first_unwinds_and_raises_once_the_first_was_lost(armed):
    with pytest.raises(Interrupted) as first:
        os.kill(os.getpid(), signal.SIGTERM)
    assert first.value.signum == signal.SIGTERM
    os.kill(os.getpid(), signal.SIGINT)  # the first is still unwinding the run: recorded, not raised over it
    assert signals.requested() == signal.SIGTERM
    signals.restore(armed)
    signals.install()
    _lose(signal.SIGTERM)  # dropped: nothing unwinds the run any more, so the next signal raises
    with pytest.raises(Interrupted) as second:
        os.kill(os.getpid(), signal.SIGINT)
    assert second.value.signum == signal.SIGINT


def test_an_exception_escaping_while_a_stop_is_recorded_becomes_interrupted(armed):
    with pytest.raises(SIGTERMException):  # no stop recorded: Lightning's exception passes unchanged
        with signals.converted():
            raise SIGTERMException
    _lose(signal.SIGTERM)
    for raised in (SIGTERMException(), RuntimeError("a library wrapped the stop")):
        with pytest.raises(Interrupted) as err:
            with signals.converted():
                raise raised
        assert err.value.signum == signal.SIGTERM and err.value.__cause__ is raised


def test_the_executor_stops_before_the_next_task_and_drops_the_task_that_ran_past_the_stop(armed):
    ran = []

    def loses_the_stop():
        _lose(signal.SIGTERM)
        return "finished after the stop"

    def records():
        ran.append(1)

    yielded = []
    with pytest.raises(Interrupted):
        for item in Executor(ExecutorConfig()).map([(loses_the_stop, {}), (records, {})], tolerate=True):
            yielded.append(item)
    assert yielded == [] and ran == []


def test_an_error_after_a_stop_is_the_stop_not_a_client_failure(armed):
    def fails_after_the_stop():
        _lose(signal.SIGINT)
        raise RuntimeError("broken by the interruption")

    with pytest.raises(Interrupted) as err:  # with tolerate, a RuntimeError alone would be a TaskFailure
        list(Executor(ExecutorConfig()).map([(fails_after_the_stop, {})], tolerate=True))
    assert err.value.signum == signal.SIGINT


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_lost_inside_a_lightning_stage_stops_it_at_the_end_of_that_batch(armed, sig):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(16, 3))
    steps = []

    def first_forward_loses_the_stop(module, args):
        steps.append(1)
        if len(steps) == 1:
            _lose(sig)

    model.register_forward_pre_hook(first_forward_loses_the_stop)
    x, y = torch.randint(0, 256, (64, 1, 8, 8), dtype=torch.uint8), torch.arange(64) % 3
    with pytest.raises(Interrupted) as err:  # 2 epochs of 4 batches; SIGINT is no concern of Lightning's own loop
        fit_supervised(model, x, y, epochs=2, batch_size=16, optimizer=default_optimizer(1e-3), transformations=None,
                       trainer=TrainerConfig(accelerator="cpu", channels_last=False), seed=0)
    assert err.value.signum == sig and len(steps) == 1
    assert signal.getsignal(signal.SIGTERM) is signals.handler  # Lightning put ours back at its teardown


def test_sigterm_lost_in_a_lightning_stage_exits_143_with_the_resume_line(repo_root, tmp_path, monkeypatch, capsys):
    """The stop is lost in client 0's first distillation step of round 1; without the per-batch check, Lightning's
    SIGTERMException escapes the stage (alone it would end the process with exit 0)."""
    monkeypatch.setattr(engine.StopRequests, "on_train_batch_end", lambda self, *a, **k: None)
    distill = distill_objective.fit_distillation

    def fit(model, *args, **kwargs):  # the teachers' stage too (they call it with x and targets by position)
        if kwargs["where"] == "round 1, client distillation, client 0":
            model.register_forward_pre_hook(lambda module, args: _lose(signal.SIGTERM))
        return distill(model, *args, **kwargs)

    monkeypatch.setattr(distill_objective, "fit_distillation", fit)
    seen = []
    report = cli._interrupted
    monkeypatch.setattr(cli, "_interrupted", lambda err, command: seen.append(err) or report(err, command))
    run_dir = tmp_path / "run"
    status = cli.main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(run_dir),
                       "--rounds", "1", "--data.num_clients", "5", "--clients.pretrain_epochs", "1",
                       "--algorithm.init_args.ptc_epochs", "1", "--algorithm.init_args.teacher_epochs", "1",
                       "--wandb.mode", "disabled", "--executor.threads_per_worker", "1"])
    err = capsys.readouterr().err
    assert status == 143
    assert err.strip().splitlines()[-1] == (f"cosmos-pl: stopped by SIGTERM; rounds 0..0 are saved in {run_dir}/"
                                            f"checkpoints: resume with `cosmos-pl fit --resume {run_dir}`")
    assert isinstance(seen[0].__cause__, SIGTERMException)
    assert "Exception ignored" not in err and "Traceback" not in err
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) == ["round-0000.pt"]  # round 1: never
    assert not (run_dir / "summary.json").exists()
    assert signal.getsignal(signal.SIGTERM) is not signals.handler  # main put the handlers back
