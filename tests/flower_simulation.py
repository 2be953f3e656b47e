"""Run configs/digits_flower.yaml with CLIENTS clients on Flower's simulation engine (one virtual SuperNode per
client, Ray): a subprocess of the Flower tests. One simulation serves several runs in turn (one Ray start); each run draws a new run token, so its
nodes start from round 0.

Usage: python tests/flower_simulation.py NODE_STATE_DIR CLIENTS RUN_DIR:ALGORITHM[:ARGS] [...]
(ARGS: more ``fit`` arguments for that run, e.g. ``--clients.backbones [test_efficientnet]``)
"""

import os
import sys
from pathlib import Path

state_dir, clients, *runs = sys.argv[1:]
os.environ["COSMOS_PL_NODE_STATE_DIR"] = state_dir  # the virtual nodes' disks (Ray workers inherit it)
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

from flwr.serverapp import ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from cosmos_pl.flower.client_app import app as client_app  # noqa: E402
from cosmos_pl.flower.server_app import main  # noqa: E402

config = Path(__file__).resolve().parents[1] / "configs" / "digits_flower.yaml"
server_app = ServerApp()


@server_app.main()
def _main(grid, context):
    for run in runs:
        run_dir, algorithm, *more = run.split(":", 2)
        main(grid, {"config": str(config), "run-dir": run_dir, "overwrite": True,
                    "args": " ".join([f"--algorithm {algorithm} --data.num_clients {clients}", *more])})


run_simulation(server_app, client_app, num_supernodes=int(clients),
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"logging_level": "ERROR", "include_dashboard": False}})
