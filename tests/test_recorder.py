"""The recorder writes metrics.csv and clients.csv after every round, whole and atomically."""

import csv

from cosmos_pl.federated.recorder import Recorder, format_csv
from cosmos_pl.federated.run_directory import RunDirectory


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
