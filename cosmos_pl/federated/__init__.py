"""The federated round loop and what it runs on: the one loop every algorithm runs (:mod:`~.runner`), the clients'
interface and its seam to the server (:mod:`~.clients`, :mod:`~.server_view`), the in-process clients of a simulation
(:mod:`~.in_process`, :mod:`~.initial_models`), the executor that runs their tasks (:mod:`~.executor`), the checks
of what clients upload (:mod:`~.received`), the failure policy, records, checkpoints and the run directory."""
