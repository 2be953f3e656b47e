"""The client objectives, one module each: the step a plan names (its fields, stage name, seed's stage id and wire
encoding), its LightningModule, its loss and its stage function, on the shared stage runner
(:func:`~cosmos_pl.objectives.stage.run_stage`) and the generic engine of :mod:`cosmos_pl.training`.

| module | step | objective | used by |
| --- | --- | --- | --- |
| :mod:`~cosmos_pl.objectives.local_fit` | ``LocalFit`` | cross-entropy on D_i | every algorithm's round 0; COSMOS (IFFT), local-only, FedMD, COMET (sequential), FedAvg, Ditto, FedBABU |
| :mod:`~cosmos_pl.objectives.distill` | ``Distill`` | KL to pseudo-labels on U + lambda r_B (Eq. 1, Eq. 2) | COSMOS (clients and teachers), FedMD, COMET (sequential) |
| :mod:`~cosmos_pl.objectives.joint` | ``JointFit`` | CE on D_i + lambda KL on U per step | COMET |
| :mod:`~cosmos_pl.objectives.union` | ``UnionFit`` | CE on D_i and U labelled by the target's argmax | FedCT |
| :mod:`~cosmos_pl.objectives.proximal` | ``ProxFit`` | CE + lambda / 2 ||v - w||^2 | Ditto |
| :mod:`~cosmos_pl.objectives.finetune` | ``FineTune`` | the global model fine-tuned with CE | FedBABU |
| :mod:`~cosmos_pl.objectives.hn_inner` | ``PFedHNFit`` | CE for a fixed number of SGD steps from the generated weights | pFedHN |
| :mod:`~cosmos_pl.objectives.mutual` | ``MutualFit`` | personal and interactive model distil into each other (CE + a T^2 KL + b MSE of features) | pFedCK |
| :mod:`~cosmos_pl.objectives.select` | ``SelectFit`` | per-index merge, mask growth, LocalAlt on masked entries | FedSelect |
| :mod:`~cosmos_pl.objectives.protocol` | ``Upload``, ``LoadWeights``, ``StartGlobal`` | no training: what is sent, loaded, copied | ``Upload``: all but local-only; ``LoadWeights``: FedAvg, Ditto, FedBABU; ``StartGlobal``: Ditto, FedBABU |

Beside them: :mod:`~cosmos_pl.objectives.step` (the :class:`~cosmos_pl.objectives.step.ClientStep` base, whose
subclasses register themselves and their stage ids), :mod:`~cosmos_pl.objectives.stage` (the stage runner),
:mod:`~cosmos_pl.objectives.wire` (a message's steps on the wire) and :mod:`~cosmos_pl.objectives.runtime` (the
settings every step reads and the inference tasks). The objective modules and ``stage`` import Lightning; ``step``,
``wire``, ``runtime`` and ``protocol`` do not, and this package imports none of its modules until
:func:`import_objectives` is called (a node decoding steps), so an algorithm's settings are parsed without the
trainer stack (the algorithms import their steps in ``plan``). A new objective is one new module here: nothing
lists it.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["import_objectives"]


def import_objectives() -> None:
    """Import every module of this package (once; Python keeps them), so that every client step is in
    :data:`~cosmos_pl.objectives.step.CLIENT_STEPS` and every stage id in
    :data:`~cosmos_pl.training.config.STAGE_IDS`.

    Raises:
        ValueError: two steps share a class name, or two stages a name or an id.
    """
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
