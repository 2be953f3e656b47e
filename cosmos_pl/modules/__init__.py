"""LightningModules, one per training objective, shared by clients and cluster teachers."""

from cosmos_pl.modules.base import CosmosModule, default_optimizer
from cosmos_pl.modules.distill import DistillationModule
from cosmos_pl.modules.joint import JointModule
from cosmos_pl.modules.supervised import ProximalModule, SupervisedModule

__all__ = ["CosmosModule", "DistillationModule", "JointModule", "ProximalModule", "SupervisedModule",
           "default_optimizer"]
