"""The executor settings of a comparison's pairs: the user's where given, compare's fill (named in pair.yaml) where
left unset."""

import yaml

from cosmos_pl.compare import pairs as compare_pairs
from cosmos_pl.compare.pairs import fill_executor

DEFAULTS = {"threads_per_worker": None, "workers_per_device": "auto"}


def _executor(**given):
    return {"kind": "auto", "devices": "auto", **DEFAULTS, **given}


def test_the_users_executor_settings_win_and_only_unset_ones_are_filled(monkeypatch):
    monkeypatch.setattr(compare_pairs, "available_cpus", lambda: 4)
    # nothing given, 2 jobs on 4 cores: 4 // 2 = 2 threads a pair, one worker per GPU each
    filled, why = fill_executor(_executor(), DEFAULTS, jobs=2)
    assert (filled["threads_per_worker"], filled["workers_per_device"]) == (2, 1)
    assert why == ["executor.threads_per_worker: 2 (this machine's 4 CPU core(s) split between --jobs 2 pair(s) side "
                   "by side; give --executor.threads_per_worker to choose)",
                   "executor.workers_per_device: 1 (--jobs 2 pairs side by side would each size their workers from "
                   "the same GPUs' free memory; give --executor.workers_per_device to choose)"]
    # --executor.threads_per_worker 1 (a busy machine): kept, only workers_per_device filled
    filled, why = fill_executor(_executor(threads_per_worker=1), DEFAULTS, jobs=2)
    assert (filled["threads_per_worker"], filled["workers_per_device"]) == (1, 1)
    assert len(why) == 1 and why[0].startswith("executor.workers_per_device: 1")
    # both given: nothing filled
    given = _executor(threads_per_worker=1, workers_per_device=3)
    assert fill_executor(given, DEFAULTS, jobs=2) == (given, [])
    # one job: 4 // 1 = 4 threads, workers_per_device left at auto
    filled, why = fill_executor(_executor(), DEFAULTS, jobs=1)
    assert (filled["threads_per_worker"], filled["workers_per_device"], len(why)) == (4, "auto", 1)
    # 3 jobs on 2 cores: 2 // 3 = 0, at least 1
    monkeypatch.setattr(compare_pairs, "available_cpus", lambda: 2)
    assert fill_executor(_executor(), DEFAULTS, jobs=3)[0]["threads_per_worker"] == 1


def test_a_slurm_jobs_cpus_fill_only_what_the_user_left_unset():
    filled, why = fill_executor(_executor(), DEFAULTS, jobs=4, threads=8)
    assert (filled["threads_per_worker"], filled["workers_per_device"]) == (8, "auto")  # --jobs does not apply
    assert why == ["executor.threads_per_worker: 8 (the Slurm job's 8 CPU(s), slurm.cpus_per_job; give "
                   "--executor.threads_per_worker to choose)"]
    assert fill_executor(_executor(threads_per_worker=2), DEFAULTS, jobs=4, threads=8) == \
        (_executor(threads_per_worker=2), [])


def test_pair_yaml_keeps_the_users_threads_names_what_compare_filled_and_still_reads_as_the_same_config(
        repo_root, tmp_path, monkeypatch):
    from cosmos_pl.class_groups import class_args, parse_args
    from cosmos_pl.compare.pairs import finished, pair_configs
    from cosmos_pl.parsers import build_compare_parser, build_fit_parser

    monkeypatch.setattr(compare_pairs, "available_cpus", lambda: 4)
    compare, fit = build_compare_parser(), build_fit_parser()

    def pair(*flags):
        cfg = compare.parse_args(class_args(compare, ["--config", str(repo_root / "configs/digits_smoke.yaml"),
                                                      "--out", str(tmp_path), *flags]))
        return pair_configs(cfg, compare, fit, tmp_path, ["local"], [0], 2)[0]

    given = pair("--executor.threads_per_worker", "1")
    executor = yaml.safe_load(given.config_yaml)["executor"]
    assert (executor["threads_per_worker"], executor["workers_per_device"]) == (1, 1)
    assert given.note.splitlines() == [
        "# cosmos-pl compare filled in these settings, which were left unset:",
        "#   executor.workers_per_device: 1 (--jobs 2 pairs side by side would each size their workers from the same "
        "GPUs' free memory; give --executor.workers_per_device to choose)"]
    unset = pair()
    assert yaml.safe_load(unset.config_yaml)["executor"]["threads_per_worker"] == 2  # 4 cores // 2 jobs
    assert "#   executor.threads_per_worker: 2 (this machine's 4 CPU core(s)" in unset.note
    # pair.yaml as launch writes it: the note above the config; fit reads it, and a rerun sees the same config
    run = given.run_dir
    run.mkdir(parents=True)
    (run / "pair.yaml").write_text(given.note + given.config_yaml)
    (run / "summary.json").write_text("{}\n")
    assert parse_args(fit, ["--config", str(run / "pair.yaml")]).executor.threads_per_worker == 1
    assert finished(given)


def test_a_failed_pair_line_keeps_the_fit_error_whole_and_cuts_only_between_words(tmp_path):
    """A data error naming five files (about 600 characters) fits whole; a longer line is shortened between words."""
    from cosmos_pl.compare.pairs import FAILURE_CHARS, failure_line

    error = "cosmos-pl: error: 5 of 90 image files cannot be decoded: " + "; ".join(
        f"/data/my_images/train/class_{i}/picture_{i}.tif (cannot identify image file)" for i in range(5))
    log = tmp_path / "log.txt"
    log.write_text("round 0: local training\n" + error + "\n")
    assert failure_line(2, log) == f"exit status 2: {error} (log: {log})"
    log.write_text("word " * 400)  # 2,000 characters
    reason = failure_line(1, log).removeprefix("exit status 1: ").removesuffix(f" (log: {log})")
    assert reason.endswith("word ...") and len(reason) <= FAILURE_CHARS
