"""A run directory holds one run: reuse is refused unless --overwrite, default names never collide, files are
readable by others as the umask allows."""

import os
import shutil
import stat

import pytest

from cosmos_pl.cli import main
from cosmos_pl.compare.pairs import Pair, finished
from cosmos_pl.errors import ConfigError
from cosmos_pl.runs.run_directory import RunDirectory, atomic_save, atomic_write_text


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_files_get_0666_less_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "summary.json", "{}\n")
        atomic_save({"a": 1}, tmp_path / "round0.pt")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "summary.json") == 0o666 & ~umask
    assert _mode(tmp_path / "round0.pt") == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round0.pt", "summary.json"]  # no temp file left


def test_a_folder_holding_a_run_is_refused_unless_overwrite(tmp_path):
    run = tmp_path / "run"
    first = RunDirectory.prepare(run)
    first.write_text("metrics.csv", "round\n0\n")
    first.release()
    (run / "pair.yaml").write_text("kept\n")
    (run / "wandb" / "offline-run-1").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "round-0003.pt").write_bytes(b"old")
    with pytest.raises(ConfigError, match=r"--run_dir='.*run': already holds the files of another run \(metrics.csv, "
                                          r"checkpoints, wandb\).*--overwrite true"):
        RunDirectory.prepare(run)
    assert (run / "metrics.csv").read_text() == "round\n0\n"  # untouched
    RunDirectory.prepare(run, overwrite=True).release()
    assert sorted(p.name for p in run.iterdir()) == ["pair.yaml"]  # the old run's files, checkpoints and wandb/
    RunDirectory.prepare(run).release()  # a folder without result files is fine (compare's pair folders)


def test_a_run_that_stopped_before_its_first_checkpoint_is_named_so_with_the_way_to_start_again(tmp_path):
    """What a divergence in round 0 leaves (its config and partition, no checkpoint, no summary) is not called
    another run: the refusal says it cannot be resumed and gives --overwrite true."""
    run = tmp_path / "run"
    first = RunDirectory.prepare(run)
    first.write_text("config.yaml", "seed: 0\n")
    first.write_text("partition.json", "{}")
    first.release()
    with pytest.raises(ConfigError) as err:
        RunDirectory.prepare(run)
    assert str(err.value) == (
        f"--run_dir={str(run)!r}: already holds the files of a run that stopped before its first checkpoint, so it "
        "cannot be resumed (config.yaml, partition.json); choose a new --run_dir, or pass --overwrite true to "
        "replace them")


def test_a_run_directory_that_is_a_file_is_a_config_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"--run_dir='.*f': is an existing file"):
        RunDirectory.prepare(tmp_path / "f")
    with pytest.raises(ConfigError, match=r"--run_dir='.*f/run': cannot be created"):
        RunDirectory.prepare(tmp_path / "f" / "run")


def test_default_names_never_collide(tmp_path):
    base = tmp_path / "runs" / "digits_smoke-20250101-120000"  # two runs started in the same second
    first, second, third = (RunDirectory.unique(base) for _ in range(3))
    assert [d.path.name for d in (first, second, third)] == [
        "digits_smoke-20250101-120000", "digits_smoke-20250101-120000-2", "digits_smoke-20250101-120000-3"]


def test_cli_refuses_a_used_run_dir_before_loading_data(repo_root, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"old": true}\n')
    args = ["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(run)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cosmos-pl: error: --run_dir=") and "summary.json" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == ["summary.json"]
    (tmp_path / "file").write_text("x")
    assert main([*args[:-1], str(tmp_path / "file")]) == 2
    assert "is an existing file" in capsys.readouterr().err


def test_compare_resumes_pairs_saved_before_the_overwrite_flag(tmp_path):
    run = tmp_path / "out" / "runs" / "cosmos-seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}\n")
    (run / "pair.yaml").write_text("seed: 0\nrounds: 2\n")  # written before --overwrite existed
    assert finished(Pair("cosmos", 0, run, "seed: 0\nrounds: 2\noverwrite: false\n"))
    with pytest.raises(ConfigError, match="made with a different config"):
        finished(Pair("cosmos", 0, run, "seed: 0\nrounds: 3\noverwrite: false\n"))


def _quick_fit(repo_root, run_dir, *flags):
    """A digits run of LocalOnly with few epochs, in-process."""
    return ["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(run_dir),
            "--algorithm", "local", "--data.num_clients", "5", "--clients.pretrain_epochs", "1",
            "--wandb.mode", "disabled", "--executor.threads_per_worker", "1", *flags]


def test_a_failed_start_leaves_nothing_that_blocks_its_run_dir(repo_root, tmp_path, capsys, monkeypatch):
    from cosmos_pl.cli import run as run_cli
    from cosmos_pl.federated.runner import Runner

    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine\n")  # not a run's file: kept
    # densenet121 cannot take 8x8 digits: refused by the backbone check, after the data was loaded and config.yaml
    # written (a run that starts writes it before its checks against the data)
    assert main(_quick_fit(repo_root, run, "--clients.backbones", "[test_efficientnet, densenet121]")) == 2
    assert "clients.backbones[1]='densenet121' cannot take this data's images" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]

    class Started(Exception):
        pass

    def started(self, *args, **kwargs):
        raise Started  # every check passed and training begins: enough to know the same folder is taken again

    monkeypatch.setattr(Runner, "run", started)
    with pytest.raises(Started):
        run_cli(_quick_fit(repo_root, run, "--clients.backbones", "[test_efficientnet]"))
    # from round 0 on the files are the run's records: kept whatever stops it
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "notes.txt", "partition.json"]
    # printed without a terminal (pytest captures it): the run's line whole, however long its path
    out = capsys.readouterr().out.splitlines()
    [line] = [line for line in out if "run directory" in line]
    assert line.startswith("cosmos-pl local on digits: 5 clients, ") and line.endswith(f"; run directory {run}")
    assert all(line == line.rstrip() for line in out)


def test_a_failed_start_removes_only_what_it_wrote(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")  # a resumed run's own files: there before it was opened
    (run / "checkpoints").mkdir()
    directory = RunDirectory.resume(run)
    directory.write_text("metrics.csv", "round\n")
    (run / "wandb" / "offline-run-1").mkdir(parents=True)
    (run / "pair.yaml").write_text("kept\n")
    assert directory.remove_failed_start() == ["metrics.csv", "wandb"]
    directory.release()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "pair.yaml"]
    assert (run / "config.yaml").read_text() == "seed: 0\n"


@pytest.mark.slow
def test_overwrite_leaves_nothing_of_the_old_run_and_checkpoints_hold_only_the_new_rounds(repo_root, tmp_path, capsys):
    import torch

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for r in range(4):  # an old, longer run's checkpoints: the new run must never see them
        (run / "checkpoints" / f"round-{r:04d}.pt").write_bytes(b"old")
    for name in ("metrics.csv", "accuracy_vs_round.png", "traffic.csv", "nodes.json"):
        (run / name).write_text("old\n")
    (run / "pair.yaml").write_text("kept\n")
    assert main(_quick_fit(repo_root, run, "--rounds", "2", "--overwrite", "true")) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["round-0001.pt", "round-0002.pt"]
    saved = torch.load(run / "checkpoints" / "round-0002.pt", weights_only=True)
    assert saved["round"] == 2 and len(saved["records"]["rows"]) == 3  # the new run's rounds 0..2
    assert not (run / "traffic.csv").exists() and not (run / "nodes.json").exists()  # the old Flower run's files
    assert (run / "pair.yaml").read_text() == "kept\n"
    assert "old" not in (run / "metrics.csv").read_text()


def test_a_read_only_run_directory_is_one_line_before_any_data_is_loaded(repo_root, tmp_path, capsys):
    import tempfile

    base = tempfile.mkdtemp(prefix="cosmos-ro-")  # outside pytest's 0700 tmp folder, so another user can reach it
    try:
        os.chmod(base, 0o755)
        run = os.path.join(base, "run")
        os.mkdir(run, 0o555)
        os.chmod(run, 0o555)
        config = (repo_root / "configs/digits_smoke.yaml").read_text()  # read before dropping privileges
        root = os.geteuid() == 0
        if root:  # root writes into read-only folders: act as an ordinary user for the run directory's checks
            os.seteuid(65534)
        try:
            status = main(["fit", "--config", config, "--run_dir", run, "--wandb.mode", "disabled"])
        finally:
            if root:
                os.seteuid(0)
        err = capsys.readouterr().err.strip()
        assert status == 2 and len(err.splitlines()) == 1, err
        assert err == (f"cosmos-pl: error: --run_dir='{run}': cannot write there (Permission denied); make it "
                       "writable (e.g. chmod u+w), free space on its disk, or choose another --run_dir")
        assert os.listdir(run) == []
    finally:
        os.chmod(os.path.join(base, "run"), 0o755)
        shutil.rmtree(base)


@pytest.mark.slow
def test_a_full_disk_while_writing_a_checkpoint_is_one_line_with_the_resume_line(repo_root, tmp_path, capsys,
                                                                                   monkeypatch):
    from cosmos_pl import files

    run = tmp_path / "run"
    real = files._create

    def full_disk_for_round_2(path):  # the device itself answers ENOSPC, as a full disk does (/dev/full)
        return os.open("/dev/full", os.O_WRONLY) if path.name.startswith(".round-0002.pt") else real(path)

    monkeypatch.setattr(files, "_create", full_disk_for_round_2)
    assert main(_quick_fit(repo_root, run, "--rounds", "3")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err == (f"cosmos-pl: error: no space left on the disk of {run}/checkpoints while writing round-0002.pt: "
                   f"free space there, or move the run directory to a disk with room; rounds 0..1 are saved in "
                   f"{run}/checkpoints: resume once fixed with `cosmos-pl fit --resume {run}`")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["round-0000.pt", "round-0001.pt"]
    monkeypatch.setattr(files, "_create", real)  # space freed: the resume finishes the run
    assert main(["fit", "--resume", str(run)]) == 0
    assert (run / "summary.json").is_file()
