"""SIGTERM and SIGINT during a run: a stop request that no code path can lose.

``cosmos-pl`` answers SIGTERM (a scheduler's time limit) and SIGINT (Ctrl-C) by raising :class:`Interrupted`
wherever the main thread is when Python runs the handler; the run unwinds, keeps its last complete round and says
how to resume. Raising alone is not enough, for two reasons:

- Python runs a signal's handler at the main thread's next bytecode boundary, and that can be inside a finalizer
  (``__del__``), a weakref callback or a gc callback: an exception leaving one of those is printed as
  "Exception ignored in ..." and dropped. Each stage's Lightning Trainer is freed by the cyclic garbage
  collector, which calls its profiler's ``__del__``; a signal that lands while a collection runs is delivered
  inside that ``__del__``, and lost.
- Inside ``Trainer.fit`` Lightning's own SIGTERM handler runs before ours (it wraps it) and sets
  ``trainer.received_sigterm``; when our exception is lost, Lightning's loop raises ``SIGTERMException``, a
  ``SystemExit`` without a code, and the process would exit 0 with the run half done.

So the handler records the signal before it raises (:func:`requested`). The run calls :func:`check` at safe
points (between executor tasks, after every training batch and Lightning stage, before a round checkpoint or the
summary is written), so an interrupted round is never committed; :func:`converted` turns any exception that
escapes while a stop is recorded (``SIGTERMException`` included) into :class:`Interrupted`. An
:class:`Interrupted` dropped in a finalizer is not printed (the stop it carries is recorded), and a second signal
while an :class:`Interrupted` is unwinding the run is only recorded, so that it cannot replace the first one (which
knows the run directory) or escape the command's own handling.

Only :func:`install` (``cosmos_pl.cli.main``) arms this; without it, :func:`check` never raises.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

__all__ = ["Interrupted", "SIGNALS", "install", "restore", "handler", "requested", "check", "converted"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_requested: Optional[int] = None  # the first stop signal since install(), or None
_in_flight = False  # an Interrupted is unwinding the run (raised, and not dropped in a finalizer)
_previous_hook: Optional[Callable[[Any], Any]] = None


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds the run (a BaseException, so no ``except Exception`` swallows it).

    Attributes:
        signum: the signal's number (15 for SIGTERM, 2 for SIGINT); the exit status is ``128 + signum``.
        run_dir, last_round: the run directory and its newest checkpoint's round, filled in by
            :func:`cosmos_pl.fit.run_fit` (None until then, or when there is none).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.run_dir: Optional[Path] = None
        self.last_round: Optional[int] = None


def _raise(signum: int) -> Interrupted:
    global _in_flight
    _in_flight = True
    return Interrupted(signum)


def handler(signum: int, frame: Any) -> None:
    """The SIGTERM/SIGINT handler: record the signal, then raise :class:`Interrupted` (unless one is already
    unwinding the run)."""
    global _requested
    if _requested is None:
        _requested = signum
    if not _in_flight:
        raise _raise(signum)


def _unraisable(info: Any) -> None:
    """``sys.unraisablehook``: an :class:`Interrupted` dropped in a finalizer or callback is recorded already (the
    next safe point raises it again); anything else goes to the previous hook."""
    global _in_flight
    if isinstance(info.exc_value, Interrupted):
        _in_flight = False
        return
    (_previous_hook or sys.__unraisablehook__)(info)


def install() -> dict[int, Any]:
    """Arm :func:`handler` for SIGTERM and SIGINT with no stop recorded; returns the handlers it replaced (for
    :func:`restore`). Main thread only (``signal.signal`` raises ValueError elsewhere)."""
    global _requested, _in_flight, _previous_hook
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    _requested, _in_flight = None, False
    if sys.unraisablehook is not _unraisable:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    return previous


def restore(previous: dict[int, Any]) -> None:
    """Put back the signal handlers in ``previous`` (from :func:`install`) and the unraisable hook; forget any
    recorded stop."""
    global _requested, _in_flight, _previous_hook
    for s, old in previous.items():
        signal.signal(s, old)
    if sys.unraisablehook is _unraisable:
        sys.unraisablehook = _previous_hook or sys.__unraisablehook__
    _requested, _in_flight, _previous_hook = None, False, None


def requested() -> Optional[int]:
    """The first stop signal (``signal.SIGTERM`` or ``signal.SIGINT``) recorded since :func:`install`, or None."""
    return _requested


def check(cause: Optional[BaseException] = None) -> None:
    """A safe point: raise :class:`Interrupted` if a stop was requested (its own exception may have been lost).

    ``cause``: the exception being handled, if any (Lightning's ``SIGTERMException``, or an error the interruption
    caused): the :class:`Interrupted` is chained to it; an :class:`Interrupted` itself is left to propagate.

    Raises:
        Interrupted: for the first signal recorded.
    """
    if _requested is not None and not isinstance(cause, Interrupted):
        raise _raise(_requested) from cause


@contextlib.contextmanager
def converted() -> Iterator[None]:
    """Inside, an exception that escapes while a stop is requested becomes :class:`Interrupted`, chained to it
    (:func:`check` with the exception); without a request it passes unchanged."""
    try:
        yield
    except BaseException as err:
        check(err)
        raise
