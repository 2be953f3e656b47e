"""``cosmos-pl compare --grid``: parsing the sweep, checking its keys, and a small grid end to end (a pair the
sweep does not touch runs once; every point has its report; the grid's table and figure)."""

import pytest

from cosmos_pl.compare.grid import algorithm_setting, grid_points, parse_grid, point_name
from cosmos_pl.errors import ConfigError


def test_grid_items_parse_as_yaml_values_and_make_their_product():
    grid = parse_grid(["data.partitioner.init_args.alpha=1,5,100", "b0=auto,0.5", "clients.backbones=[a, b],[c]"])
    assert grid == [("data.partitioner.init_args.alpha", [1, 5, 100]), ("b0", ["auto", 0.5]),
                    ("clients.backbones", [["a", "b"], ["c"]])]  # commas inside brackets stay in the value
    points = grid_points(grid[:2])
    assert points == [{"data.partitioner.init_args.alpha": a, "b0": b} for a in (1, 5, 100) for b in ("auto", 0.5)]
    assert point_name(points[1]) == "alpha=1,b0=0.5"
    assert [algorithm_setting(k) for k in ("algorithm.init_args.lambda_", "algorithm.b0", "temperature",
                                           "data.num_clients")] == ["lambda_", "b0", "temperature", None]


@pytest.mark.parametrize("items, message", [
    (["alpha"], "--grid 'alpha': give KEY=V1,V2,..."),
    (["alpha="], "--grid 'alpha=': give KEY=V1,V2,..."),
    (["b0=1,2", "b0=3"], "--grid b0: given twice"),
])
def test_bad_grid_items_are_one_line(items, message):
    with pytest.raises(ConfigError) as err:
        parse_grid(items)
    assert str(err.value).startswith(message)


def _compare(repo_root, out, *extra):
    from cosmos_pl.cli import main

    return main(["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "cosmos,local",
                 "--seeds", "0", "--rounds", "1", "--data.num_clients", "5", "--clients.pretrain_epochs", "1",
                 "--algorithm.init_args.ptc_epochs", "1", "--algorithm.init_args.teacher_epochs", "1",
                 "--executor.threads_per_worker", "1", "--wandb.mode", "disabled", "--out", str(out), *extra])


def test_grid_keys_that_name_nothing_fail_before_any_pair_runs(repo_root, tmp_path, capsys):
    assert _compare(repo_root, tmp_path / "a", "--grid", "data.partitioner.init_args.alfa=1,5") == 2
    assert "--grid data.partitioner.init_args.alfa: no such setting" in capsys.readouterr().err
    assert _compare(repo_root, tmp_path / "b", "--grid", "num_clusters=2,3") == 2  # COMET's, not compared here
    assert "--grid num_clusters: none of the algorithms (cosmos, local) takes 'num_clusters'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_misspelt_grid_key_gets_the_closest_valid_one():
    from jsonargparse import Namespace

    from cosmos_pl.compare.grid import check_keys

    cfg = Namespace(rounds=3, data=Namespace(partitioner=Namespace(init_args=Namespace(alpha=5.0))))
    cases = [("lamda_", "--grid lamda_: none of the algorithms (cosmos, local) takes 'lamda_'; did you mean "
                         "'lambda_'?"),
             ("algorithm.init_args.lamda_", "--grid algorithm.init_args.lamda_: none of the algorithms (cosmos, local) "
                                            "takes 'lamda_'; did you mean 'algorithm.init_args.lambda_'?"),
             ("round", "--grid round: none of the algorithms (cosmos, local) takes 'round'; did you mean 'rounds'?"),
             ("data.partitioner.init_args.alfa", "--grid data.partitioner.init_args.alfa: no such setting; did you "
                                                 "mean 'data.partitioner.init_args.alpha'? (see cosmos-pl fit")]
    for key, message in cases:
        with pytest.raises(ConfigError) as err:
            check_keys([(key, [0.1, 1])], cfg, ["cosmos", "local"])
        assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(ConfigError) as err:  # nothing close: no guess
        check_keys([("zzz", [1])], cfg, ["cosmos", "local"])
    assert str(err.value) == "--grid zzz: none of the algorithms (cosmos, local) takes 'zzz'"


@pytest.mark.slow  # one small digits run (local-only), and conftest's small digits run
def test_a_lambda_grid_runs_each_distinct_pair_once_and_reports_every_point(repo_root, tmp_path, capsys, monkeypatch,
                                                                          small_digits_run):
    import shutil

    import yaml

    from cosmos_pl.compare import command

    out = tmp_path / "grid"
    # the plan, as a dry run makes it (it writes nothing)
    plans = []
    make_plan = command.make_plan
    monkeypatch.setattr(command, "make_plan", lambda *args: plans.append(make_plan(*args)) or plans[-1])
    assert _compare(repo_root, out, "--grid", "lambda_=0,5", "--dry_run", "true") == 0
    assert "3 distinct pairs, 0 already finished" in " ".join(capsys.readouterr().out.split()) and not out.exists()
    # COSMOS's pair at each point planted as an earlier compare leaves a finished one: its pair.yaml as compare writes
    # it (pairs.launch: the note, then the pair's config) and the records the report reads, summary.json and
    # metrics.csv, those of a real COSMOS digits run (conftest's small digits run). What is tested is which pairs run
    # where and the reports, not their training: local-only really runs
    [plan] = plans
    planted = [p for p in plan.unique if p.algorithm == "cosmos"]
    assert [p.run_dir for p in planted] == [out / "lambda_=0" / "runs" / "cosmos-seed0",
                                            out / "lambda_=5" / "runs" / "cosmos-seed0"]
    for pair in planted:
        pair.run_dir.mkdir(parents=True)
        (pair.run_dir / "pair.yaml").write_text(pair.note + pair.config_yaml)
        for name in ("summary.json", "metrics.csv"):
            shutil.copy(small_digits_run / name, pair.run_dir / name)
    assert _compare(repo_root, out, "--grid", "lambda_=0,5") == 0
    assert "3 distinct pairs, 2 already finished" in " ".join(capsys.readouterr().out.split())
    for pair in planted:  # finished pairs are read, not run again
        assert (pair.run_dir / "metrics.csv").read_text() == (small_digits_run / "metrics.csv").read_text()
    for value in (0, 5):
        folder = out / f"lambda_={value}"
        assert (folder / "comparison.md").is_file() and (folder / "accuracy_vs_round.png").is_file()
        pair = yaml.safe_load((folder / "runs" / "cosmos-seed0" / "pair.yaml").read_text())
        assert pair["algorithm"]["init_args"]["lambda_"] == value
    # local-only takes no lambda_: run once, at the first point, and read there by the second
    assert (out / "lambda_=0" / "runs" / "local-seed0").is_dir()
    assert not (out / "lambda_=5" / "runs" / "local-seed0").exists()
    grid = (out / "grid.md").read_text()
    assert grid.count("local takes no 'lambda_': the same run at every lambda_ (not swept)") == 2
    assert "\n# lambda_ = 0\n" in grid and "\n# lambda_ = 5\n" in grid  # a table per point
    assert (out / "grid_lambda_.png").stat().st_size > 0
    # a rerun finds every pair finished
    capsys.readouterr()
    assert _compare(repo_root, out, "--grid", "lambda_=0,5") == 0
    assert "3 distinct pairs, 3 already finished" in " ".join(capsys.readouterr().out.split())  # unwrapped
    # a dry run over the finished grid: nothing would run, and the report is left as it was
    before = (out / "grid.md").stat().st_mtime_ns
    assert _compare(repo_root, out, "--grid", "lambda_=0,5", "--dry_run", "true") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "3 distinct pairs, 3 already finished" in said and "0 would run" in said
    assert "lambda_=0: 0 to run" in said and "lambda_ is not swept for local: one run serves every value" in said
    assert (out / "grid.md").stat().st_mtime_ns == before


def test_grid_values_that_are_numbers_are_numbers_and_seed_is_compares_own_axis():
    assert parse_grid(["temperature=1e-1,2"]) == [("temperature", [0.1, 2])]  # YAML 1.1 reads 1e-1 as text
    assert parse_grid(["b0=inf,auto"]) == [("b0", ["inf", "auto"])]  # words stay words
    with pytest.raises(ConfigError, match="--grid seed: the seeds are compare's own axis; give --seeds"):
        parse_grid(["seed=0,1"])


def test_a_top_level_setting_is_a_config_key_not_an_algorithms():
    from jsonargparse import Namespace

    cfg = Namespace(rounds=3, clients_per_round=None)
    assert algorithm_setting("rounds", cfg) is None and algorithm_setting("clients_per_round", cfg) is None
    assert algorithm_setting("b0", cfg) == "b0"


def test_an_algorithm_that_does_not_take_a_swept_setting_gets_one_line_in_the_figure():
    from cosmos_pl.compare.grid import grid_lines
    from cosmos_pl.compare.report import AlgorithmRow

    def row(name, mean):
        return AlgorithmRow(name, "client", [0, 1], {"mean": mean, "sem": 0.01}, {"mean": mean, "sem": 0.01},
                            {"mean": 0.5, "sem": 0.0}, [])

    alpha = "data.partitioner.init_args.alpha"
    # COMET takes `mode`, COSMOS does not: COSMOS's run is the same at both modes
    tables = [({alpha: a, "mode": m}, [row("cosmos", 0.8 + a / 1000), row("comet", 0.7 + a / 1000 + (m == "joint"))],
               []) for a in (1, 5) for m in ("joint", "sequential")]
    lines = grid_lines(tables, alpha, [1, 5], {"mode": ["cosmos"]})
    assert sorted(lines) == ["comet (mode=joint)", "comet (mode=sequential)", "cosmos"]
    assert lines["cosmos"] == [(1.0, 0.801, 0.01), (5.0, 0.805, 0.01)]
    assert lines["comet (mode=joint)"] == [(1.0, 1.701, 0.01), (5.0, 1.705, 0.01)]


def test_the_validation_table_bolds_each_algorithms_best_point_and_never_a_column_read_at_every_point():
    from cosmos_pl.compare.grid import NO_VALIDATION, grid_markdown, validation_markdown
    from cosmos_pl.compare.report import PairResult, summarize

    def pair(name, seed, test, val):
        return PairResult(name, seed, [0.5, test], "client model f_i", {}, rounds_val=[0.5, val])

    # COMET at K = 3, 5 and 7 (validation 0.80 / 0.82, 0.86 / 0.88 and 0.88 / 0.86 on seeds 0 / 1: K = 5 and 7 tie);
    # local-only, which takes no K, is the same run (0.84 / 0.84) at every point. Test accuracy says the opposite for
    # COMET: never used here.
    tables = []
    for k, (v0, v1) in ((3, (0.80, 0.82)), (5, (0.86, 0.88)), (7, (0.88, 0.86))):
        pairs = [pair("comet", 0, 0.9 - v0, v0), pair("comet", 1, 0.9 - v1, v1),
                 pair("local", 0, 0.70, 0.84), pair("local", 1, 0.72, 0.84)]
        tables.append(({"num_clusters": k}, summarize(pairs, reference="comet"), []))
    md = validation_markdown(tables, frozenset({"local"}))
    # K = 5: mean(0.86, 0.88) = 0.87, sample std 0.01414, SEM 0.01; K = 3: 0.81 ± 0.01; local 0.84 ± 0
    assert "| point | comet | local |" in md
    assert "| num_clusters=3 | 0.8100 ± 0.0100 | 0.8400 ± 0.0000 |" in md
    assert "| num_clusters=5 | **0.8700 ± 0.0100** | 0.8400 ± 0.0000 |" in md
    assert "| num_clusters=7 | **0.8700 ± 0.0100** | 0.8400 ± 0.0000 |" in md  # a tie: both bold
    # had local-only been swept (not read at every point), its tie across all points would be bold
    assert "| num_clusters=3 | 0.8100 ± 0.0100 | **0.8400 ± 0.0000** |" in validation_markdown(tables)
    grid = grid_markdown(tables, "made-up", "top1", frozenset({"local"}))
    assert grid.index("## Validation accuracy at each point") < grid.index("# num_clusters = 3")
    # the per-point tables carry the same figure in their last column
    assert "| 0.5000 ± 0.0000 | - | - | - | 0.8700 ± 0.0100 |" in grid.split("# num_clusters = 5")[1]
    # runs without a validation split: no table, and grid.md says in one line how to get it
    bare = [({"num_clusters": 3}, summarize([PairResult("comet", 0, [0.5, 0.6], "client model f_i", {})]), [])]
    assert validation_markdown(bare) == ""
    no_split = grid_markdown(bare, "made-up", "top1")
    assert NO_VALIDATION in no_split and len(NO_VALIDATION.strip().splitlines()) == 1
    assert "--data.validation_fraction 0.1" in NO_VALIDATION
    assert no_split.index(NO_VALIDATION) < no_split.index("# num_clusters = 3")
    assert NO_VALIDATION not in grid  # the grid above had a validation split
    failed = [({"num_clusters": 3}, summarize([PairResult("comet", 0, error="exit status 1: boom")]), [])]
    assert NO_VALIDATION not in grid_markdown(failed, "made-up", "top1")  # no run finished: nothing to say of splits


def test_grid_md_says_at_each_point_how_cosmos_clustered_and_where_it_fell_back():
    from cosmos_pl.compare.grid import clustering_markdown, grid_markdown
    from cosmos_pl.compare.report import PairResult, summarize

    def pair(name, seed, n, k, weak, ari):
        clusters = None if k is None else {"K": k, "N": n, "weak": weak, "ari": ari}
        return PairResult(name, seed, [0.5, 0.6], "cluster teacher h_pi(i)", {}, clusters=clusters)

    # the number-of-clients axis: at 10 clients both seeds find the 5 groups; at 20, seed 1 keeps no cluster (K = N
    # = 20, weak, ARI 0); local-only does not cluster and gets no column
    tables = []
    for n, seed1 in ((10, (5, False, 1.0)), (20, (20, True, 0.0))):
        pairs = [pair("cosmos", 0, n, 5, False, 1.0), pair("cosmos", 1, n, *seed1),
                 pair("local", 0, n, None, None, None), pair("local", 1, n, None, None, None)]
        tables.append(({"data.num_clients": n}, summarize(pairs), []))
    md = clustering_markdown(tables)
    assert "| point | cosmos |" in md and "local" not in md.split("| point |")[1]
    assert "| num_clients=10 | K 5.0 (5, 5); ARI 1.00 (1.00, 1.00) |" in md
    # K mean (5 + 20) / 2 = 12.5, seed 1 starred; ARI (1 + 0) / 2 = 0.50
    assert "| num_clients=20 | K 12.5 (5, 20*); ARI 0.50 (1.00, 0.00); fell back: seed 1 |" in md
    grid = grid_markdown(tables, "made-up", "top1")
    assert grid.index("## Clusters at each point") < grid.index("# data.num_clients = 10")
    no_clusters = [({"data.num_clients": 10}, summarize([pair("local", 0, 10, None, None, None)]), [])]
    assert clustering_markdown(no_clusters) == ""


def test_an_algorithm_is_read_at_every_point_when_its_runs_are_the_same_objects_at_each():
    from dataclasses import replace
    from pathlib import Path

    from cosmos_pl.compare.grid import read_everywhere
    from cosmos_pl.compare.plan import ComparePlan, Pair, Point
    from cosmos_pl.compare.wandb_runs import TableRun

    def pair(name, seed):
        return Pair(name, seed, Path("runs") / f"{name}-seed{seed}", "")

    local = [pair("local", 0), pair("local", 1)]  # shared by both points
    comet = [[pair("comet", 0), pair("comet", 1)], [pair("comet", 0), pair("comet", 1)]]  # a run per point
    points = tuple(Point({"num_clusters": k}, Path(f"p{k}"), tuple(comet[j] + local)) for j, k in enumerate((3, 5)))
    plan = ComparePlan(Path("out"), ("comet", "local"), (0, 1), 1, "made-up", "top1",
                       TableRun("out", "disabled", "cosmos-pl", None, (), "top1"), None,
                       (("num_clusters", [3, 5]),), points, tuple(comet[0] + comet[1] + local),
                       {"num_clusters": ["local"]})
    assert read_everywhere(plan) == frozenset({"local"})
    assert read_everywhere(replace(plan, points=points[:1])) == frozenset()
