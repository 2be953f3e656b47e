"""Tests of cosmos_pl.analysis and of notebooks/explore_run.ipynb on a tiny,
hand-made run directory (no training needed)."""

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

import matplotlib

matplotlib.use("Agg")

from cosmos_pl.analysis import (  # noqa: E402
    contingency,
    figure_skipped,
    final_clients_table,
    find_run,
    headline,
    load_run,
    plot_accuracy,
    plot_clusters,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO_ROOT / "notebooks" / "explore_run.ipynb"

# Hand-made run: rounds 0 (local-only), 1, 2; 4 clients in 2 true groups.
TRUE_GROUPS = [0, 0, 1, 1]
ASSIGNMENT = [0, 0, 1, 0]  # client 3 lands in the "wrong" cluster
EXPECTED_CONTINGENCY = [[2, 0], [1, 1]]
# per round: teacher accs (None at round 0) and client accs, one per client
TEACHER = {0: [None] * 4, 1: [0.75, 0.5, 0.75, 0.5], 2: [1.0, 0.75, 0.875, 0.875]}
CLIENT = {0: [0.5, 0.5, 0.625, 0.625], 1: [0.625, 0.625, 0.75, 0.75], 2: [0.75, 0.75, 0.875, 0.875]}


def _mean_sem(xs):
    a = np.asarray(xs, float)
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(a.size))


def write_run(root: Path, true_groups=TRUE_GROUPS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cols = [
        "round", "phase", "num_clusters", "teacher_acc_mean", "teacher_acc_sem",
        "client_acc_mean", "client_acc_sem", "upload_bytes_per_client", "download_bytes_per_client",
    ]
    with (root / "metrics.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in range(3):
            cm, cs = _mean_sem(CLIENT[r])
            if r == 0:
                w.writerow([0, "local-only", "", "", "", f"{cm:.6f}", f"{cs:.6f}", 0, 0])
            else:
                tm, ts = _mean_sem(TEACHER[r])
                w.writerow([r, "PTC", 2, f"{tm:.6f}", f"{ts:.6f}", f"{cm:.6f}", f"{cs:.6f}", 400, 400])
    with (root / "clients.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["round", "client", "backbone", "cluster", "teacher_acc", "client_acc"])
        for r in range(3):
            for i in range(4):
                t = TEACHER[r][i]
                w.writerow([r, i, "test_resnet", -1 if r == 0 else ASSIGNMENT[i],
                            "" if t is None else f"{t:.6f}", f"{CLIENT[r][i]:.6f}"])
    ari = 0.0 if true_groups is not None else None
    clusters = {
        "b0": 0.4, "b0_setting": "auto", "distance": "l1", "K": 2,
        "assignment": ASSIGNMENT, "clusters": [[0, 1, 3], [2]],
        "true_groups": true_groups, "adjusted_rand_index": ari,
        "distances": [[0.0 if i == j else 0.5 for j in range(4)] for i in range(4)],
    }
    (root / "clusters.json").write_text(json.dumps(clusters, indent=2))
    tm, ts = _mean_sem(TEACHER[2])
    cm, cs = _mean_sem(CLIENT[2])
    lm, ls = _mean_sem(CLIENT[0])
    summary = {
        "final": {"round": 2, "teacher_acc": {"mean": tm, "sem": ts}, "client_acc": {"mean": cm, "sem": cs}},
        "best": {"round": 2, "teacher_acc": {"mean": tm, "sem": ts}, "client_acc": {"mean": cm, "sem": cs}},
        "local_only": {"round": 0, "client_acc": {"mean": lm, "sem": ls}},
        "clusters": {"K": 2, "b0": 0.4, "assignment": ASSIGNMENT, "adjusted_rand_index": ari},
        "communication": {"upload_bytes_per_client_per_round": 400, "download_bytes_per_client_per_round": 400,
                          "rounds": 2, "public_samples": 10, "num_classes": 10},
        "wall_seconds": 1.0,
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    (root / "config.yaml").write_text("seed: 0\nrounds: 2\ndata:\n  num_clients: 4\n")
    (root / "partition.json").write_text(json.dumps({"dataset": "synthetic", "num_classes": 10}))
    return root


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run")


def test_load_run_parses(run_dir):
    run = load_run(run_dir)
    m = run["metrics"]
    assert [r["round"] for r in m] == [0, 1, 2]
    assert m[0]["phase"] == "local-only"
    assert m[0]["teacher_acc_mean"] is None and m[0]["teacher_acc_sem"] is None
    assert m[0]["num_clusters"] is None
    assert m[2]["teacher_acc_mean"] == pytest.approx(0.875)
    assert m[1]["teacher_acc_mean"] == pytest.approx(0.625)
    assert isinstance(m[1]["client_acc_mean"], float)
    assert len(run["clients"]) == 12
    assert run["clients"][0]["teacher_acc"] is None
    assert run["clients"][-1] == {"round": 2, "client": 3, "backbone": "test_resnet", "cluster": 0,
                                  "teacher_acc": 0.875, "client_acc": 0.875}
    assert run["clusters"]["true_groups"] == TRUE_GROUPS
    assert run["summary"]["final"]["teacher_acc"]["mean"] == pytest.approx(0.875)
    assert run["config"]["rounds"] == 2 and run["config"]["data"]["num_clients"] == 4


def test_load_run_without_clients_csv(run_dir):
    (run_dir / "clients.csv").unlink()
    run = load_run(run_dir)
    assert run["clients"] == []
    assert "no clients.csv" in final_clients_table(run)


def test_contingency():
    table = contingency(ASSIGNMENT, TRUE_GROUPS)
    np.testing.assert_array_equal(table, EXPECTED_CONTINGENCY)
    assert table.sum() == 4
    with pytest.raises(ValueError):
        contingency([0, 1], [0])


def test_plot_accuracy(run_dir):
    ax = plot_accuracy(load_run(run_dir))
    assert ax.get_xlabel() == "round"
    assert ax.get_ylabel() == "personalized accuracy (top-1)"
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    teacher = next(ln for lbl, ln in lines.items() if lbl.startswith("cluster teacher"))
    client = next(ln for lbl, ln in lines.items() if lbl.startswith("client"))
    np.testing.assert_allclose(teacher.get_xdata(), [1, 2])  # teacher starts at round 1
    np.testing.assert_allclose(teacher.get_ydata(), [0.625, 0.875], atol=1e-6)
    np.testing.assert_allclose(client.get_xdata(), [0, 1, 2])
    local = next(ln for lbl, ln in lines.items() if lbl.startswith("local-only"))
    assert local.get_linestyle() == "--"
    np.testing.assert_allclose(local.get_ydata(), [0.5625, 0.5625])
    assert len(ax.collections) == 2  # two SEM bands
    assert ax.get_legend() is not None


def test_plot_clusters_heatmap(run_dir):
    ax = plot_clusters(load_run(run_dir))
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), EXPECTED_CONTINGENCY)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["2", "0", "1", "1"]
    assert "K = 2" in ax.get_title() and "ARI = 0.000" in ax.get_title()
    assert ax.get_ylabel() == "true group" and ax.get_xlabel() == "found cluster"


def test_plot_clusters_without_true_groups(tmp_path):
    ax = plot_clusters(load_run(write_run(tmp_path / "run", true_groups=None)))
    assert not ax.get_images()
    assert [p.get_height() for p in ax.patches] == [3, 1]


def test_headline_and_table(run_dir):
    run = load_run(run_dir)
    text = headline(run)
    assert "final teacher accuracy: 0.8750 ± 0.0510" in text
    assert "local-only client accuracy (round 0): 0.5625" in text
    assert "K = 2" in text and "ARI = 0.000" in text
    table = final_clients_table(run).splitlines()
    assert table[0] == "round 2" and len(table) == 2 + 4
    assert "true_group" in table[1]
    assert "top-5" not in text
    run["metrics"][2].update(teacher_top5_mean=0.96875, teacher_top5_sem=0.03125)
    assert "final teacher top-5 accuracy: 0.9688 ± 0.0312" in headline(run)


def _execute_notebook(run_dir: Path, timeout: int = 300):
    """Execute notebooks/explore_run.ipynb against run_dir; return (nb, all output text)."""
    # plain imports, not importorskip: these are test dependencies, and a missing one must fail
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {
        "COSMOS_RUN_DIR": str(run_dir),
        "PYTHONPATH": os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p),
        "MPLBACKEND": "Agg",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # kernel "python3": jupyter_client rewrites a kernel spec argv of "python"
        # to sys.executable, so the kernel runs in the interpreter running pytest.
        client = nbclient.NotebookClient(
            nb, kernel_name="python3", timeout=timeout,
            resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}},
        )
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text.append(out["text"])
            elif out.get("output_type") == "error":  # pragma: no cover - execute() raises first
                text.append("\n".join(out.get("traceback", [])))
            elif "data" in out:
                text.append(out["data"].get("text/plain", ""))
    return nb, "\n".join(text)


def test_notebook_is_saved_without_outputs():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert any('RUN_DIR = os.environ.get("COSMOS_RUN_DIR")' in c.source for c in nb.cells)
    assert any("load_run(find_run(RUN_DIR))" in c.source for c in nb.cells)  # None: the newest run under runs/


def test_notebook_executes_on_synthetic_run(run_dir):
    nb, text = _execute_notebook(run_dir)
    assert "Traceback" not in text
    assert "0.8750" in text  # final teacher accuracy
    assert "0.5625" in text  # local-only client accuracy
    assert str(run_dir) in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 2  # accuracy plot + cluster plot


def test_a_stopped_run_is_not_shown_as_finished(run_dir):
    finished = headline(load_run(run_dir))
    assert "status: finished" in finished and "final round: 2" in finished
    (run_dir / "summary.json").unlink()  # a run stopped by a signal or a failure writes none
    text = headline(load_run(run_dir)).splitlines()
    assert text[1] == (f"status: NOT FINISHED (no summary.json): stopped after round 2; resume it with "
                       f"`cosmos-pl fit --resume {run_dir}`, the figures below are its last complete round")
    assert "last complete round: 2" in text and not any(line.startswith("final round") for line in text)


def write_local_only_run(root: Path) -> Path:
    """The hand-made run as LocalOnly records it: no clusters.json, summary.json's clusters all null."""
    write_run(root)
    (root / "clusters.json").unlink()
    summary = json.loads((root / "summary.json").read_text())
    summary.update(algorithm="local", scored_model="client model f_i",
                   clusters={"K": None, "b0": None, "assignment": None, "adjusted_rand_index": None})
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def test_a_run_without_clusters_gets_a_sentence_not_an_empty_chart(tmp_path):
    run = load_run(write_local_only_run(tmp_path / "run"))
    sentence = "no clusters: local forms none (K = None), so there is no cluster chart"
    assert figure_skipped(run, "clusters") == sentence and figure_skipped(run, "accuracy") is None
    with pytest.raises(ValueError) as err:
        plot_clusters(run)
    assert str(err.value) == sentence
    text = headline(run).splitlines()
    assert text[-1] == "clusters: none (local forms none)" and "K = None" not in headline(run)
    (tmp_path / "run" / "summary.json").unlink()  # a clustering run stopped before its first clustering
    assert figure_skipped(load_run(tmp_path / "run"), "clusters") == (
        "no clusters recorded yet (no clusters.json): no cluster chart")
    # with clusters (COSMOS): the chart applies
    assert figure_skipped(load_run(write_run(tmp_path / "cosmos")), "clusters") is None


def test_notebook_on_a_run_without_clusters(tmp_path):
    nb, text = _execute_notebook(write_local_only_run(tmp_path / "run"))
    assert "no clusters: local forms none (K = None), so there is no cluster chart" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1  # the accuracy plot only


def _write_comparison(out: Path, finished: bool) -> Path:
    for pair in ("cosmos-seed0", "local-seed0"):  # compare writes pair.yaml before the pair's run starts
        (out / "runs" / pair).mkdir(parents=True)
        (out / "runs" / pair / "pair.yaml").write_text("seed: 0\n")
    (out / "round0").mkdir()
    if finished:
        (out / "comparison.md").write_text("| algorithm | personalized accuracy |\n| cosmos | 0.8750 |\n")
    return out


def test_a_comparison_folder_is_recognized_as_one(tmp_path):
    out = _write_comparison(tmp_path / "cmp", finished=True)
    run = load_run(out)
    assert run["kind"] == "comparison" and run["runs"] == [out / "runs" / "cosmos-seed0", out / "runs" / "local-seed0"]
    assert headline(run).splitlines() == [
        f"comparison: {out}",
        "status: finished (its report: comparison.md)",
        "its runs (2): runs/cosmos-seed0, runs/local-seed0",
        f"to explore one, set RUN_DIR to it, e.g. {out / 'runs' / 'cosmos-seed0'}",
        "",
        "| algorithm | personalized accuracy |",
        "| cosmos | 0.8750 |",
    ]
    assert "NOT FINISHED" not in headline(run) and "--resume" not in headline(run)
    for figure in ("accuracy", "clusters"):
        assert figure_skipped(run, figure) == (f"{out} is a comparison: its figures are the .png files in it; set "
                                               "RUN_DIR to one of its runs for that run's figures")
    with pytest.raises(ValueError, match="is a comparison"):
        plot_accuracy(run)
    assert final_clients_table(run).startswith("(a comparison: each of its runs has its own clients.csv")
    # before its report: a comparison still, to resume with compare (not fit --resume)
    running = load_run(_write_comparison(tmp_path / "running", finished=False))
    assert running["kind"] == "comparison" and not running["finished"]
    assert headline(running).splitlines()[1] == (
        "status: not finished (no comparison.md yet): still running, or stopped; run the same `cosmos-pl compare` "
        "command again to resume it (finished pairs are kept)")


def test_find_run_defaults_to_the_newest_run_or_comparison_under_runs(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    older = write_run(runs / "fmnist_quickstart-20250101-120000")
    newer = _write_comparison(runs / "fmnist_compare", finished=True)
    (runs / "failed-start").mkdir()  # nothing of a run in it: never chosen
    (runs / "notes.txt").write_text("x")
    for path, mtime in ((older, 1_000_000), (newer, 2_000_000), (runs / "failed-start", 3_000_000)):
        os.utime(path, (mtime, mtime))
    monkeypatch.chdir(tmp_path)
    assert find_run() == Path("runs/fmnist_compare")
    os.utime(older, (4_000_000, 4_000_000))  # a file written in it since
    assert find_run(None) == find_run("") == Path("runs/fmnist_quickstart-20250101-120000")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")  # the notebook opened from notebooks/: the repository's runs/
    assert find_run() == Path("../runs/fmnist_quickstart-20250101-120000")
    assert find_run("runs/fmnist_compare") == Path("../runs/fmnist_compare")
    assert find_run("/elsewhere/run") == Path("/elsewhere/run")  # given: as it is (load_run names a missing one)
    monkeypatch.chdir(tmp_path / "runs" / "failed-start")
    with pytest.raises(FileNotFoundError) as err:
        find_run()
    assert str(err.value) == (f"no run or comparison under {(tmp_path / 'runs' / 'failed-start' / 'runs').resolve()}: "
                              "make one (`make demo` writes runs/fmnist_quickstart-<time>/), or set COSMOS_RUN_DIR "
                              "(or RUN_DIR) to a run directory")
