"""A run's folder: the files one run writes and the lock that keeps a second process out.

- the folder: :mod:`~cosmos_pl.runs.run_directory` (one run per folder, every file written atomically) and its
  lock (:mod:`~cosmos_pl.runs.locks`, also taken on a comparison's ``--out`` folder);
- the records: metrics.csv, clients.csv and summary.json (:mod:`~cosmos_pl.runs.recorder`);
- the round checkpoints: writing, finding and reading ``checkpoints/round-XXXX.pt`` to resume a run
  (:mod:`~cosmos_pl.runs.checkpoint`).

Nothing here runs a round: the round loop (:mod:`cosmos_pl.federated`) and the commands write through these.
"""
