"""Training on one machine: the settings of every stage, the Lightning stages, and the client objectives.

- :mod:`cosmos_pl.training.config`: :class:`TrainerConfig`, the device it resolves to, each stage's seed;
- :mod:`cosmos_pl.training.stages`: one Lightning Trainer per stage, batched inference and evaluation;
- :mod:`cosmos_pl.training.steps`: the client steps a round is made of, each with its own client behaviour and wire
  encoding, and the client runtime that runs them, the same in an in-process worker and on a Flower node.

Nothing here imports :mod:`cosmos_pl.algorithms` or :mod:`cosmos_pl.federated`: they build on it.
"""
