"""A Flower run is a simulation or a deployment (cosmos_pl/flower/server_app.py, run_mode), and a deployment's
ServerApp builds no client data: it runs inside cosmos_pl/data/guard.py's no_client_data, under which every
constructor of client data raises."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from cosmos_pl.data import ClientData, Digits, load_site  # noqa: E402
from cosmos_pl.data.guard import ClientDataForbidden, no_client_data  # noqa: E402
from cosmos_pl.errors import ConfigError  # noqa: E402
from cosmos_pl.flower import server_app  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_flower.yaml"


class InMemoryGrid:  # the name of flwr.simulation's grid, which run_mode reads as a simulation
    pass


def test_the_mode_comes_from_the_grid_or_the_run_config_and_a_deployment_needs_public():
    assert server_app.run_mode(InMemoryGrid(), {}) == "simulation"
    assert server_app.run_mode(object(), {"simulation": True}) == "simulation"
    assert server_app.run_mode(object(), {"public": "op/public.npz"}) == "deployment"
    with pytest.raises(ConfigError, match=r"^run config 'public' is empty, and this run is a deployment: its server "
                                          r"holds only U and the class list, never a client's data; give "
                                          r"public='<folder>/public\.npz'"):
        server_app.run_mode(object(), {"public": ""})
    for key in ("public", "sites"):
        with pytest.raises(ConfigError, match=f"run config {key}='x' is for a deployment, and this run is a "
                                              "simulation"):
            server_app.run_mode(InMemoryGrid(), {key: "x"})


def test_no_client_data_is_built_inside_the_guard_and_the_guard_is_undone_after(tmp_path):
    (tmp_path / "site").mkdir()
    np.savez(tmp_path / "site" / "data.npz", x_train=np.zeros((2, 1, 8, 8), np.uint8), y_train=np.array([0, 1]),
             x_test=np.zeros((1, 1, 8, 8), np.uint8), y_test=np.array([0]), classes=np.array(["0", "1"]))
    with no_client_data("a deployment's server holds none"):
        with pytest.raises(ClientDataForbidden, match="^the data set 'digits' was about to be built here, and a "
                                                      "deployment's server holds none$"):
            Digits().load()
        with pytest.raises(ClientDataForbidden, match="^a client's data"):
            ClientData(*[None] * 5)
        with pytest.raises(ClientDataForbidden, match="data was about to be built"):
            load_site(tmp_path / "site", ["0", "1"], (1, 8, 8), 0.0, 0, 0)
    assert len(load_site(tmp_path / "site", ["0", "1"], (1, 8, 8), 0.0, 0, 0).y) == 2  # allowed again


def test_a_deployments_server_app_runs_the_fit_inside_the_guard(monkeypatch, tmp_path):
    """server_app.main in a deployment: run_fit runs with the guard on; building the config's data set there raises
    (what the localhost deployment test relies on: its run completes, so nothing built client data)."""
    import cosmos_pl.fit
    from cosmos_pl.cli import main

    assert main(["export-partition", "--config", str(CONFIG), "--data.num_clients", "3", "--out",
                 str(tmp_path / "sites")]) == 0
    seen = {}

    def fake_run_fit(cfg, parser, transport, server):
        seen["server"] = server
        try:
            cfg_data = parser.instantiate(cfg).data
            cfg_data.build(0)
        except ClientDataForbidden as err:
            seen["raised"] = str(err)

    monkeypatch.setattr(cosmos_pl.fit, "run_fit", fake_run_fit)
    server_app.main(object(), {"config": str(CONFIG), "public": str(tmp_path / "sites" / "public.npz"),
                               "args": "--data.num_clients 3"})
    assert seen["server"].classes == [str(c) for c in range(10)] and "raised" in seen
    assert seen["raised"].startswith("the data set 'digits' was about to be built here, and a Flower deployment's "
                                     "server holds no client's data")
    Digits().load()  # and not after the run
