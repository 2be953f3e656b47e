"""The worker pool: where a stage's independent tasks run, in this process or in parallel worker processes.

- the pool: :mod:`~cosmos_pl.execution.executor` (the executor and its settings), the value of a task that did not
  finish (:mod:`~cosmos_pl.execution.task_failure`, which the round loop and the Flower transport take without the
  pool) and a stage's tasks run with their progress and timers (:mod:`~cosmos_pl.execution.tasks`);
- the machine: the devices, CPU cores, workers per GPU and shared memory a run may use
  (:mod:`~cosmos_pl.execution.devices`, also read by the config checks and by compare's side-by-side pairs);
- the wire to a worker: a task's arguments and trained model on their way (:mod:`~cosmos_pl.execution.transfer`)
  and how an object crosses a worker's pipe (:mod:`~cosmos_pl.execution.pipe`).

Nothing here knows the round: the pool runs :class:`~cosmos_pl.objectives.step.Task` objects the round loop
(:mod:`cosmos_pl.federated`) hands it.
"""
