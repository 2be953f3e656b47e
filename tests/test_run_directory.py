"""A run directory holds one run: reuse is refused unless --overwrite, default names never collide, files are
readable by others as the umask allows (issue 8, item 6)."""

import os
import stat

import pytest

from cosmos_pl.cli import main
from cosmos_pl.compare.pairs import Pair, _finished
from cosmos_pl.errors import ConfigError
from cosmos_pl.federated.run_directory import RunDirectory, atomic_save, atomic_write_text


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
    RunDirectory.prepare(run).write_text("metrics.csv", "round\n0\n")
    (run / "pair.yaml").write_text("kept\n")
    (run / "wandb" / "offline-run-1").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"--run_dir='.*run': already holds the files of another run \(metrics.csv\)"
                                          r".*--overwrite true"):
        RunDirectory.prepare(run)
    assert (run / "metrics.csv").read_text() == "round\n0\n"  # untouched
    RunDirectory.prepare(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["pair.yaml"]  # the old run's files and wandb/ are gone
    RunDirectory.prepare(run)  # a folder without result files is fine (compare's pair folders)


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
    assert _finished(Pair("cosmos", 0, run, "seed: 0\nrounds: 2\noverwrite: false\n"))
    with pytest.raises(ConfigError, match="made with a different config"):
        _finished(Pair("cosmos", 0, run, "seed: 0\nrounds: 3\noverwrite: false\n"))
