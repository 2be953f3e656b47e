"""The table (docs/comparisons.md) of the paper's axes: every command there plans (``--dry_run true``: each pair's config parsed,
built and checked as a run would) with the number of distinct pairs worked out by hand, and writes nothing."""

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "docs" / "comparisons.md"

# distinct pairs with one seed (the test adds --seeds 0); cosmos, comet, fedmd, local are fmnist_alpha's algorithms
EXPECTED = {
    # 3 alphas x 2 modes: COMET at all 6 points, COSMOS / FedMD / local-only (no `mode`) once per alpha: 6 + 3 * 3
    "Dirichlet alpha": 15,
    "client architecture mix": 3 * 4,
    "number of clients": 3 * 4,
    "size of U": 3 * 4,
    "server (teacher) architecture": 3,  # --algorithms cosmos
    "threshold B0 (the number of clusters)": 3,
    "lambda": 3,
    "temperature": 3,
    "aggregation rule": 3,
    # no grid: fmnist_homogeneous's ten algorithms (COSMOS and every homogeneous baseline of the paper's Table 7,
    # FedAvg and local-only)
    "homogeneous clients, personalized baselines": 10,
}


def _axes() -> dict[str, str]:
    section = README.read_text().split("**The paper's axes, one command each**", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| [^|]+ \| ([^|]+) \| `(cosmos-pl compare [^`]+)` \|$", section, re.M)
    return {axis.strip(): command for axis, command in rows}


def test_readme_lists_every_axis():
    assert sorted(_axes()) == sorted(EXPECTED)


@pytest.mark.parametrize("axis", sorted(EXPECTED))
def test_each_axis_command_plans_its_pairs_and_writes_nothing(axis, repo_root, tmp_path, capsys, monkeypatch):
    from cosmos_pl.cli import main

    monkeypatch.chdir(repo_root)  # the commands name configs/ relative to the repository
    out = tmp_path / "out"
    argv = shlex.split(_axes()[axis])[1:] + ["--seeds", "0", "--out", str(out), "--dry_run", "true"]
    assert main(argv) == 0
    said = " ".join(capsys.readouterr().out.split())
    pairs = EXPECTED[axis]
    if "--grid" in argv:
        assert f": {pairs} distinct pairs, 0 already finished" in said
    else:
        assert f"dry run: {pairs} pairs" in said
    assert f"{pairs} would run" in said
    assert not out.exists()
