"""cosmos-pl on Flower: the same algorithms and client steps across machines, only pseudo-labels on the wire.

Two transports run one implementation of each algorithm, behind one interface
(:class:`~cosmos_pl.federated.clients.Clients`): in-process clients (``cosmos-pl fit``) and Flower nodes (this
package: :class:`~cosmos_pl.flower.server.FlowerClients`). The ``ServerApp`` (:mod:`cosmos_pl.flower.server_app`)
drives the same round loop, upload checks, aggregation and records as ``cosmos-pl fit``; the ``ClientApp``
(:mod:`cosmos_pl.flower.client_app`) runs the same client runtime (:mod:`cosmos_pl.objectives`) on the node that
holds the client's data, and keeps the client's model there between rounds (node state, plus a checkpoint on the
node's disk).
``cosmos-pl flower-run`` (:mod:`cosmos_pl.flower.run`) is ``flwr run`` that waits for the run and exits
non-zero unless it completed.

On the wire (:mod:`cosmos_pl.flower.wire`): pseudo-label arrays (dtype and top-k per ``communication``), targets
and round instructions; model weights only for FedAvg, Ditto and FedBABU, which average parameters by definition.
``flwr`` is an optional dependency: ``pip install 'cosmos-pl[flower]'``; this package is the only one that imports
it.

The server side: :mod:`~cosmos_pl.flower.server_app` (the ServerApp), :mod:`~cosmos_pl.flower.server` (the clients
behind the round loop, their messages), :mod:`~cosmos_pl.flower.joining` (nodes joining, ``nodes.json``),
:mod:`~cosmos_pl.flower.replies` (a node's reply or failure), :mod:`~cosmos_pl.flower.validate` (the one check of
every node reply), :mod:`~cosmos_pl.flower.bindings` (which SuperNode key holds which client: ``sites.toml``). The
node side: :mod:`~cosmos_pl.flower.client_app`
(the ClientApp), :mod:`~cosmos_pl.flower.node` (the message handlers), :mod:`~cosmos_pl.flower.node_data` (the run's
settings, the client's data and U, the data cache), :mod:`~cosmos_pl.flower.node_state` (the node's directories,
identity and committed model). Both: :mod:`~cosmos_pl.flower.wire`; deployment tools: :mod:`~cosmos_pl.flower.run`,
:mod:`~cosmos_pl.flower.keys`, :mod:`~cosmos_pl.flower.localhost` (a deployment on this machine: ``make deploy-demo``).

A run is a simulation or a deployment (:func:`~cosmos_pl.flower.server_app.run_mode`); a deployment's ServerApp
builds no client data (:mod:`cosmos_pl.data.guard`).
"""

from __future__ import annotations

__all__ = ["require_flwr"]


def require_flwr() -> None:
    """Raise ImportError with the install command when ``flwr`` is missing."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("cosmos_pl.flower needs Flower: pip install 'cosmos-pl[flower]' (flwr 1.42)") from err
