"""The generic training engine on one machine: what runs any objective, and nothing of any one objective.

- :mod:`cosmos_pl.training.config`: :class:`~cosmos_pl.training.config.TrainerConfig`, the device it resolves to, each stage's seed;
- :mod:`cosmos_pl.training.module`: :class:`~cosmos_pl.training.module.CosmosModule`, the base LightningModule (uint8 batches in, the loss
  checked finite every step), and the default optimizer;
- :mod:`cosmos_pl.training.engine`: one Lightning Trainer per stage, the loaders;
- :mod:`cosmos_pl.training.resident`: the GPU copies of resident data (a client's data, U), one per process;
- :mod:`cosmos_pl.training.checks`: the non-finite and out-of-memory checks and their messages;
- :mod:`cosmos_pl.training.inference`: batched inference (pseudo-labels on U) and evaluation (accuracies);
- :mod:`cosmos_pl.training.client`: the clients' settings and the state a client keeps between rounds.

The client objectives (a step, its LightningModule, its loss) are in :mod:`cosmos_pl.objectives`, built on this.
Nothing here imports :mod:`cosmos_pl.objectives`, :mod:`cosmos_pl.algorithms` or :mod:`cosmos_pl.federated`.
"""
