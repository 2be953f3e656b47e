"""Local-only training: the floor every federated method must beat.

Each client trains on its own labelled data D_i every round and communicates nothing. Round 0 (E0 local epochs)
is shared by every algorithm; this method simply keeps going for the same number of rounds.

Scored model: the client model f_i.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cosmos_pl.algorithms.base import Algorithm

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["LocalOnly"]


class LocalOnly(Algorithm):
    """Clients train ``clients.local_epochs`` epochs of cross-entropy on D_i per round; no uploads, no server."""

    name = "local"
    uses_public = False

    def phase(self, rnd: int) -> str:
        return "local"

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.local_fit import LocalFit

        return [LocalFit(self.ctx.local_epochs)]
