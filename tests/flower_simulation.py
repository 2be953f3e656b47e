"""Run a config on Flower's simulation engine (one virtual SuperNode per client): a subprocess of the Flower tests.

Usage: python tests/flower_simulation.py RUN_DIR NODE_STATE_DIR [cosmos-pl fit flags ...]
The config is configs/digits_flower.yaml; the flags are passed on (e.g. ``--algorithm FedMD``).
"""

import os
import shlex
import sys
from pathlib import Path

run_dir, state_dir, *flags = sys.argv[1:]
os.environ["COSMOS_PL_NODE_STATE_DIR"] = state_dir  # the virtual nodes' disks (Ray workers inherit it)
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

from flwr.simulation import run_simulation  # noqa: E402

from cosmos_pl.flower.client_app import app as client_app  # noqa: E402
from cosmos_pl.flower.server_app import make_server_app  # noqa: E402

config = Path(__file__).resolve().parents[1] / "configs" / "digits_flower.yaml"
server_app = make_server_app(config=str(config), overwrite=True, args=shlex.join(flags), **{"run-dir": run_dir})
run_simulation(server_app, client_app, num_supernodes=6,
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"logging_level": "ERROR"}})
