"""The objectives register themselves: every client step by its class name, every seed's stage id by its stage name,
with the ids every seed was derived from (a changed id would change every number of a run), and a second class or
stage under a taken name or id is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

import cosmos_pl.algorithms  # noqa: F401  (the algorithms' server stages register their ids)
from cosmos_pl.objectives import import_objectives
from cosmos_pl.objectives.step import CLIENT_STEPS, ClientStep
from cosmos_pl.training.config import STAGE_IDS, register_stage, stage_seed


def test_every_step_and_stage_id_is_registered_with_its_id():
    import_objectives()
    assert STAGE_IDS == {"init": 0, "local": 1, "teacher": 2, "distill": 3, "teacher_init": 4, "joint": 5,
                         "union": 6, "kmeans": 7, "prox": 8, "finetune": 9,
                         "hypernet": 12, "hn_inner": 13, "mutual": 10, "select": 11}
    assert {"LocalFit", "Distill", "JointFit", "UnionFit", "ProxFit", "FineTune", "StartGlobal"} <= set(CLIENT_STEPS)
    steps = {name: cls for name, cls in CLIENT_STEPS.items() if cls.__module__.startswith("cosmos_pl.")}
    assert {name: cls.seed_stage for name, cls in steps.items()} == {
        "LocalFit": "local", "Distill": "distill", "JointFit": "joint", "UnionFit": "union", "ProxFit": "prox",
        "FineTune": "finetune", "StartGlobal": "",
        "PFedHNFit": "hn_inner", "MutualFit": "mutual", "SelectFit": "select"}
    # a seed is a function of the id: SeedSequence([seed, round, id, model id])
    assert stage_seed(0, 1, "distill", 2) == 3625706239


def test_a_stage_name_or_id_taken_is_refused():
    register_stage("local", 1)  # the same pair again: nothing to do
    with pytest.raises(ValueError, match="stage 'local' with id 10: the name or the id is taken"):
        register_stage("local", 10)
    with pytest.raises(ValueError, match="stage 'another' with id 1: the name or the id is taken"):
        register_stage("another", 1)
    assert "another" not in STAGE_IDS and STAGE_IDS["local"] == 1


def test_a_second_step_class_of_a_taken_name_is_refused():
    import_objectives()
    with pytest.raises(ValueError, match="client step 'LocalFit' is defined twice"):
        @dataclass(frozen=True)
        class LocalFit(ClientStep):
            epochs: int
    assert CLIENT_STEPS["LocalFit"].__module__ == "cosmos_pl.objectives.local_fit"


def test_a_step_with_a_taken_stage_id_is_refused():
    with pytest.raises(ValueError, match="stage 'mine' with id 3"):
        @dataclass(frozen=True)
        class Mine(ClientStep):
            seed_stage: ClassVar[str] = "mine"
            stage_id: ClassVar[int] = 3
    assert "mine" not in STAGE_IDS
