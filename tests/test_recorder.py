"""The recorder writes metrics.csv and clients.csv after every round, whole and atomically."""

import csv

from cosmos_pl.runs.recorder import Recorder, format_csv
from cosmos_pl.runs.run_directory import RunDirectory
from cosmos_pl.report import plot_run, run_curves


def test_files_are_rewritten_after_every_round(tmp_path):
    rec = Recorder(RunDirectory(tmp_path))
    rec.add_round({"round": 0, "phase": "local-only", "teacher_acc_mean": None, "client_acc_mean": 0.5},
                  [{"round": 0, "client": 0, "client_acc": 0.5}])
    assert [r["round"] for r in csv.DictReader(open(tmp_path / "metrics.csv"))] == ["0"]
    rec.add_round({"round": 1, "phase": "PTC", "teacher_acc_mean": 0.75, "client_acc_mean": 0.625, "teacher_kl": 0.1},
                  [{"round": 1, "client": 0, "client_acc": 0.625}])
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["round"] for r in rows] == ["0", "1"]
    # a column first seen in a later round is added, empty for earlier rounds; floats carry 6 decimals
    assert rows[0]["teacher_kl"] == "" and rows[1]["teacher_kl"] == "0.100000"
    assert rows[0]["teacher_acc_mean"] == "" and rows[1]["teacher_acc_mean"] == "0.750000"
    assert len(list(csv.DictReader(open(tmp_path / "clients.csv")))) == 2
    assert not list(tmp_path.glob(".*.tmp"))


def test_format_csv_by_hand():
    text = format_csv([{"a": 1, "b": 0.5}, {"a": 2, "c": None}])
    assert text == "a,b,c\n1,0.500000,\n2,,\n"


def test_state_round_trip():
    rec = Recorder()
    rec.add_round({"round": 0}, [{"round": 0, "client": 1}])
    other = Recorder()
    other.load_state_dict(rec.state_dict())
    assert other.rows == rec.rows and other.client_rows == rec.client_rows


def test_run_curves_by_hand():
    # rows as metrics.csv holds them: round 0 has no teacher; validation is missing in round 2 (NaN) and in
    # round 0 ("" as read back from the csv)
    rows = [
        {"round": 0, "teacher_acc_mean": None, "teacher_acc_sem": None, "client_acc_mean": 0.5, "client_acc_sem": 0.1,
         "teacher_val_acc_mean": "", "client_val_acc_mean": ""},
        {"round": 1, "teacher_acc_mean": 0.7, "teacher_acc_sem": 0.05, "client_acc_mean": 0.6, "client_acc_sem": 0.02,
         "teacher_val_acc_mean": 0.75, "teacher_val_acc_sem": 0.01, "client_val_acc_mean": 0.65,
         "client_val_acc_sem": 0.03},
        {"round": 2, "teacher_acc_mean": 0.8, "teacher_acc_sem": 0.04, "client_acc_mean": 0.55, "client_acc_sem": 0.0,
         "teacher_val_acc_mean": float("nan"), "client_val_acc_mean": float("nan")},
    ]
    assert run_curves(rows) == {
        "teacher h_pi(i), test": [(1, 0.7, 0.05), (2, 0.8, 0.04)],
        "client f_i, test": [(0, 0.5, 0.1), (1, 0.6, 0.02), (2, 0.55, 0.0)],
        "teacher h_pi(i), validation": [(1, 0.75, 0.01)],
        "client f_i, validation": [(1, 0.65, 0.03)],
    }


def test_plot_run_writes_a_png_atomically(tmp_path):
    rows = [{"round": 0, "client_acc_mean": 0.5, "client_acc_sem": 0.1},
            {"round": 1, "client_acc_mean": 0.6, "client_acc_sem": 0.1}]
    path = tmp_path / "accuracy_vs_round.png"
    plot_run(rows, path, "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["accuracy_vs_round.png"]  # no temporary file left


def test_without_a_terminal_lines_are_printed_whole(capsys):
    import io

    from cosmos_pl.report import log_console, print_table

    path = "/scratch/a-user/experiments/cosmos-pl/runs/fmnist_quickstart-20250101-120000-2"  # 80 characters
    line = f"cosmos-pl cosmos on FashionMNIST: 10 clients, |U| = 800, M = 10; run directory {path}"
    stream = io.StringIO()  # a file or a pipe: rich would lay it out in 80 columns, splitting the path
    console = log_console(stream)
    console.print(f"[bold]cosmos-pl[/bold] {line.removeprefix('cosmos-pl ')}")
    console.print("clusters: K = 5, adjusted Rand index vs true groups = 0.6667")
    assert stream.getvalue() == f"{line}\nclusters: K = 5, adjusted Rand index vs true groups = 0.6667\n"
    log_console().print(line)  # standard output, captured by pytest: not a terminal either
    assert capsys.readouterr().out == f"{line}\n"
    # the round table gets the width it needs: no cell broken over two lines, no line padded with spaces
    rows = [{"round": r, "phase": "IFFT", "teacher_acc_mean": 0.8125, "teacher_acc_sem": 0.0125,
             "client_acc_mean": 0.75, "client_acc_sem": 0.025, "client_top5_mean": 0.96875, "client_top5_sem": 0.0,
             "teacher_top5_mean": 1.0, "teacher_top5_sem": 0.0, "num_clusters": 5,
             "upload_bytes_per_client": 1_234_567_890, "download_bytes_per_client": 1_234_567_890} for r in (1, 2)]
    stream = io.StringIO()
    print_table(rows, log_console(stream))
    table = stream.getvalue().splitlines()
    assert len(table) == 1 + 3 + 2 + 1  # title, top rule + header + rule, one line per round, bottom rule
    assert len(table[2]) > 80 and "1,234,567,890 / 1,234,567,890" in table[4]
    assert all(line == line.rstrip() for line in table)
