"""The federated run: the one round loop every algorithm runs on, and what it needs around it.

- the round loop: :mod:`~cosmos_pl.federated.runner`, its round bookkeeping (:mod:`~cosmos_pl.federated.round_state`),
  the clients sampled per round (:mod:`~cosmos_pl.federated.sampling`) and the uploads it accepts
  (:mod:`~cosmos_pl.federated.received`);
- the clients: one interface (:mod:`~cosmos_pl.federated.clients`), built from what the server lets them see
  (:mod:`~cosmos_pl.federated.server_view`, never the round loop itself), the in-process ones of a simulation
  (:mod:`~cosmos_pl.federated.in_process`), a client's architecture and round-0 model on every transport
  (:mod:`~cosmos_pl.federated.initial_models`) and what the server holds of the data
  (:mod:`~cosmos_pl.federated.server_data`);
- where tasks run: the task pool (:mod:`~cosmos_pl.federated.executor`), the devices, cores and GPU sizing it uses
  (:mod:`~cosmos_pl.federated.devices`), a stage's tasks with their progress (:mod:`~cosmos_pl.federated.tasks`) and
  their arguments on the way to a worker (:mod:`~cosmos_pl.federated.transfer`);
- failures: their settings and errors (:mod:`~cosmos_pl.federated.failures`);
- the records: round checkpoints (:mod:`~cosmos_pl.federated.checkpoint`), the rows and summary
  (:mod:`~cosmos_pl.federated.evaluation`, :mod:`~cosmos_pl.federated.recorder`), the run directory and its lock
  (:mod:`~cosmos_pl.federated.run_directory`, :mod:`~cosmos_pl.federated.locks`).
"""
