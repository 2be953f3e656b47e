"""The federated round: the one round loop every algorithm runs on, and the clients it runs with.

- the round loop: :mod:`~cosmos_pl.federated.runner`, the settings it is built from
  (:mod:`~cosmos_pl.federated.settings`), its round bookkeeping (:mod:`~cosmos_pl.federated.round_state`),
  the clients sampled per round (:mod:`~cosmos_pl.federated.sampling`), the uploads it accepts
  (:mod:`~cosmos_pl.federated.received`) and the round's scores and summary (:mod:`~cosmos_pl.federated.evaluation`);
- the clients: one interface (:mod:`~cosmos_pl.federated.clients`), built from what the server lets them see
  (:mod:`~cosmos_pl.federated.server_view`, never the round loop itself), the in-process ones of a simulation
  (:mod:`~cosmos_pl.federated.in_process`), a client's architecture and round-0 model on every transport
  (:mod:`~cosmos_pl.federated.initial_models`) and what the server holds of the data
  (:mod:`~cosmos_pl.federated.server_data`);
- failures: their settings and errors (:mod:`~cosmos_pl.federated.failures`).

Where a stage's tasks run is :mod:`cosmos_pl.execution`'s (the worker pool); the run's files, records and
checkpoints are :mod:`cosmos_pl.runs`'s.
"""
