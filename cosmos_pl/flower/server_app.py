"""The Flower ``ServerApp``: ``cosmos-pl fit`` with its clients on Flower nodes.

Its main parses the same YAML configs as ``cosmos-pl fit`` and calls the same :func:`cosmos_pl.fit.run_fit`
(run directory, config.yaml, metrics.csv, summary.json, W&B) with :class:`~cosmos_pl.flower.server.FlowerClients`
as the clients. Its settings come from Flower's run config (``[tool.flwr.app.config]`` in pyproject.toml, or
``flwr run . --run-config "config='configs/digits_flower.yaml' run-dir='runs/x'"``):

- ``config``: the YAML config (a path relative to the working directory or to the project);
- ``run-dir``: the run directory (empty: a new ``runs/<config>-<time>``); ``overwrite``: reuse a used one;
- ``args``: any further ``cosmos-pl fit`` flags, e.g. ``"--seed 1 --rounds 3"``;
- ``reply-timeout``: seconds a step waits for the nodes' replies (0: ``failures.timeout_s``, else 600);
- ``join-timeout``: seconds to wait before round 0 for one node per client (it stops earlier, with the reason, once
  at least one node per client is connected and each has answered, some refusing);
- ``rejoin-timeout``: seconds to wait at the start of a round for the clients whose node left (default 0: they fail
  that round); it stops once each client has a node again. A node restarted under SuperNode authentication can come
  back only after the SuperLink has marked its old session offline (2 missed heartbeats of 30 s);
- ``node-state-dir``: where nodes keep their committed models when their node config gives no ``state-dir``;
- ``simulation``: true for a run on Flower's simulation engine through a SuperLink (``flwr run .`` with a
  simulation federation); ``flwr.simulation.run_simulation``'s in-memory grid is one without saying so;
- ``public`` (a deployment: required): the public set U and the class list (``public.npz``, as ``cosmos-pl
  export-partition`` writes it);
- ``sites`` (a deployment): the operator's ``sites.toml``, naming which SuperNode key holds which client
  (:mod:`cosmos_pl.flower.bindings`); without it client ids are not bound to keys (said in one line).

A run is a simulation or a deployment. In a simulation each node takes its partition of the data set the config
names, and the server builds the same federation (it knows the true groups, and reports them). In a deployment each
site serves its own folder (node config ``data=<folder>``; a node without one refuses to join) and the ServerApp
never constructs a client's data: it holds U, the class list and what each node reports of its client, and runs
inside :func:`cosmos_pl.data.guard.no_client_data`, so any attempt to build client data in it raises. Each node is
sent U once (its own disk keeps it by fingerprint).
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from cosmos_pl.errors import ConfigError, UserError  # no torch: a missing config fails before it is imported

__all__ = ["app", "make_server_app", "fit_argv", "main", "run_mode"]

_PROJECT = Path(__file__).resolve().parents[2]


def _config_path(value: str) -> str:
    """A relative config path is looked up in the working directory, then in the app bundle that ``flwr run`` sent
    (Flower puts its folder on ``sys.path``; it carries ``configs/``), then in the cosmos-pl project."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return str(path)
    for root in [*(Path(p) for p in sys.path if p), _PROJECT]:
        if (root / path).is_file():
            return str(root / path)
    return str(path)  # not found: cosmos-pl fit names the missing file


def fit_argv(run_config: dict[str, Any]) -> list[str]:
    """The ``cosmos-pl fit`` arguments a Flower run config stands for.

    Raises:
        ConfigError: ``config`` is missing.
    """
    if not run_config.get("config"):
        raise ConfigError("run config 'config' is empty: give a YAML config, e.g. flwr run . --run-config "
                          "\"config='configs/digits_flower.yaml'\"")
    argv = ["--config", _config_path(str(run_config["config"]))]
    if run_config.get("run-dir"):
        argv += ["--run_dir", str(run_config["run-dir"])]
    if run_config.get("overwrite"):
        argv += ["--overwrite", "true"]
    return argv + shlex.split(str(run_config.get("args", "")))


@contextlib.contextmanager
def _task_keepalive(grid: Grid, every_s: float = 5.0):
    """A second task heartbeat to the SuperLink while the ServerApp runs, one that survives every error.

    Flower 1.42's own sender (``flwr.supercore.heartbeat.HeartbeatSender``, every ~20 s) retries only transport
    errors and HTTP 503/504: any other HTTP error ends its thread, and 60 s later the SuperLink fails the whole run
    with "No heartbeat received from the task" (seen once in a loaded test run: ``tests/test_flower_deployment.py``).
    A heartbeat is idempotent, so a second sender costs one small request per ``every_s`` seconds. A grid without
    a runtime client (``flwr.simulation``'s in-memory grid) needs none.
    """
    send = getattr(getattr(grid, "_runtime_client", None), "SendTaskHeartbeat", None)
    if send is None:
        yield
        return
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest  # pylint: disable=no-name-in-module

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                send(SendTaskHeartbeatRequest())
            except Exception:  # noqa: BLE001 - keep beating; Flower's own sender reports its errors
                pass

    thread = threading.Thread(target=beat, name="cosmos-pl task keepalive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def run_mode(grid: Grid, run_config: dict[str, Any]) -> str:
    """``"simulation"`` on Flower's in-memory grid (``flwr.simulation``) or with run config ``simulation=true``, else
    ``"deployment"``.

    Raises:
        ConfigError: a deployment without ``public``, or a simulation given ``public`` or ``sites``.
    """
    simulated = bool(run_config.get("simulation")) or type(grid).__name__ == "InMemoryGrid"
    if simulated:
        given = [k for k in ("public", "sites") if run_config.get(k)]
        if given:
            raise ConfigError(f"run config {given[0]}={run_config[given[0]]!r} is for a deployment, and this run is a "
                              "simulation (its nodes take their partition of the configured data set); drop it, or "
                              "drop simulation=true")
        return "simulation"
    if not run_config.get("public"):
        raise ConfigError("run config 'public' is empty, and this run is a deployment: its server holds only U and "
                          "the class list, never a client's data; give public='<folder>/public.npz' as cosmos-pl "
                          "export-partition wrote it (or simulation=true for Flower's simulation engine)")
    return "deployment"


def main(grid: Grid, run_config: dict[str, Any]) -> None:
    """Run ``cosmos-pl fit`` over the nodes connected to ``grid``: a simulation, or a deployment whose ServerApp
    builds no client data (module docstring).

    Raises:
        UserError: a bad setting (an unknown or invalid flag in ``args`` is a ConfigError; a deployment without
            ``public``; a bad ``sites`` file), missing data, nodes that did not join, a round that failed (also
            printed as one ``cosmos-pl: error:`` line, which Flower's run status repeats: ``flwr ls --run-id``).
    """
    try:
        argv = fit_argv(run_config)  # before the imports of torch and Lightning: a missing config fails at once
        mode = run_mode(grid, run_config)
        from jsonargparse import ArgumentError

        from cosmos_pl.class_groups import parse_args
        from cosmos_pl.fit import run_fit
        from cosmos_pl.parsers import build_fit_parser
        from cosmos_pl.flower.server import FlowerClients

        parser = build_fit_parser()
        try:
            cfg = parse_args(parser, argv)
        except ArgumentError as err:  # an unknown key or a wrong type, as cosmos-pl fit reports it
            raise ConfigError(f"{err} (run config 'config' and 'args' are cosmos-pl fit's; options: cosmos-pl fit "
                              "--help)") from None
        site_keys = None
        if run_config.get("sites"):
            from cosmos_pl.flower.bindings import load_site_keys

            site_keys = load_site_keys(str(run_config["sites"]), int(cfg.data.num_clients))
        transport = functools.partial(FlowerClients, grid=grid, mode=mode, site_keys=site_keys,
                                      reply_timeout_s=float(run_config.get("reply-timeout", 0)) or None,
                                      join_timeout_s=float(run_config.get("join-timeout", 600)),
                                      rejoin_timeout_s=float(run_config.get("rejoin-timeout", 0)))
        if mode == "simulation":
            with _task_keepalive(grid):
                run_fit(cfg, parser, transport, None)  # the server builds the simulated federation
            return
        from cosmos_pl.data import load_public
        from cosmos_pl.data.guard import no_client_data
        from cosmos_pl.federated.server_data import ServerData

        server = ServerData(*load_public(_config_path(str(run_config["public"]))))
        with _task_keepalive(grid), no_client_data("a Flower deployment's server holds no client's data (its sites "
                                                   "do): this is a bug in cosmos-pl"):
            run_fit(cfg, parser, transport, server)
    except UserError as err:
        print(f"cosmos-pl: error: {' '.join(str(err).split())}", flush=True)
        raise


def make_server_app(**defaults: Any) -> ServerApp:
    """A ServerApp whose run config falls back to ``defaults`` (the keys above, e.g. ``config="..."``,
    ``**{"run-dir": "..."}``): for ``flwr.simulation.run_simulation``, which passes no run config."""
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        main(grid, {**defaults, **{k: v for k, v in dict(context.run_config).items() if v != ""}})

    return server


app = make_server_app()
