"""The client objectives, one module each: the step a plan names (its fields, stage name and wire encoding), its
LightningModule, its loss and its stage function, on the generic engine of :mod:`cosmos_pl.training`.

| module | step | objective | used by |
| --- | --- | --- | --- |
| :mod:`~cosmos_pl.objectives.local_fit` | ``LocalFit`` | cross-entropy on D_i | every algorithm's round 0; COSMOS (IFFT), local-only, FedMD, COMET (sequential), FedAvg, Ditto, FedBABU |
| :mod:`~cosmos_pl.objectives.distill` | ``Distill`` | KL to pseudo-labels on U + lambda r_B (Eq. 1, Eq. 2) | COSMOS (clients and teachers), FedMD, COMET (sequential) |
| :mod:`~cosmos_pl.objectives.joint` | ``JointFit`` | CE on D_i + lambda KL on U per step | COMET |
| :mod:`~cosmos_pl.objectives.union` | ``UnionFit`` | CE on D_i and U labelled by the target's argmax | FedCT |
| :mod:`~cosmos_pl.objectives.proximal` | ``ProxFit`` | CE + lambda / 2 ||v - w||^2 | Ditto |
| :mod:`~cosmos_pl.objectives.finetune` | ``FineTune`` | the global model fine-tuned with CE | FedBABU |
| :mod:`~cosmos_pl.objectives.protocol` | ``Upload``, ``LoadWeights``, ``StartGlobal`` | no training: what is sent, loaded, copied | ``Upload``: all but local-only; ``LoadWeights``: FedAvg, Ditto, FedBABU; ``StartGlobal``: Ditto, FedBABU |

Beside them: :mod:`~cosmos_pl.objectives.step` (the :class:`~cosmos_pl.objectives.step.ClientStep` base), :mod:`~cosmos_pl.objectives.wire`
(a message's steps on the wire) and :mod:`~cosmos_pl.objectives.runtime` (the settings every step reads and the
inference tasks). The objective modules import Lightning; ``step``, ``wire``, ``runtime`` and ``protocol`` do not, and this package imports none of
its modules, so an algorithm's settings are parsed without the trainer stack (the algorithms import their steps in
``plan``).
"""
