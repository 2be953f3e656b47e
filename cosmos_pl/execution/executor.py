"""Where independent stage work runs: in this process one task after another, or in a pool of workers.

A task is one model's stage (a client's local training, its pseudo-labels on U, a cluster teacher, a
client's distillation, an evaluation). Tasks of a stage are independent, and each is seeded from
(seed, round, stage, id), so on the CPU results do not depend on the executor or the number of workers (on a GPU,
with ``trainer.deterministic: true``; docs/execution.md says what is reproducible where). Workers are
processes started with ``spawn``; a task and its result cross a worker's pipe by value, and what stays the same all
run (the clients' data, U) is shared once through ``/dev/shm`` where it fits (:mod:`cosmos_pl.execution.transfer`),
so a worker holds a handful of file descriptors however many models cross. On CUDA each worker is pinned to one GPU
(``CUDA_VISIBLE_DEVICES``) and several workers may share one (``workers_per_device``); which devices, how many
workers and how many threads each is :mod:`cosmos_pl.execution.devices`'s to say.

A client's task may fail (an exception, a non-finite loss, a timeout, a worker process killed by the OS): with
``tolerate`` the executor reports it as a :class:`TaskFailure` and carries on with the others. A CUDA error that
leaves a process's CUDA context unusable (a device-side assert, an illegal memory access) fails its task and ends
the worker, which is replaced; in the main process it stops the run (:class:`~cosmos_pl.errors.DeviceError`). A task
that runs a GPU shared by several workers out of memory is tried once more on a fresh worker before the run stops.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterator, Literal, Optional, Sequence, Union

import torch

from cosmos_pl import signals
from cosmos_pl.errors import ConfigError, DataError, DeviceError, DeviceMemoryError, check
from cosmos_pl.execution.devices import (SEQUENTIAL, SHARED, physical_gpu, resolve_devices, shared_memory_free,
                                         shared_memory_plan, worker_threads, workers_per_gpu)
from cosmos_pl.execution.pipe import Template, receive, send
from cosmos_pl.execution.task_failure import TaskFailure
from cosmos_pl.execution.transfer import (STAGE_PREFIX, Residents, built, pack, repeated_models, trained_reply,
                                          unpack)
from cosmos_pl.limits import ResourceLimitError, memory_available, open_file_limit_line, too_many_open_files
from cosmos_pl.objectives.step import Task
from cosmos_pl.training.checks import BROKEN_CONTEXT, OUT_OF_MEMORY, cuda_error_kind

__all__ = ["ExecutorConfig", "Executor", "TaskTimeout"]


@dataclass
class ExecutorConfig:
    """How a stage's independent tasks are spread.

    Args:
        kind: 'auto' (parallel when there are GPUs and more than one worker slot: every visible GPU, times
            ``workers_per_device``; else sequential, as on a CPU), 'sequential' (one after another in this
            process, on the first GPU of ``devices``) or 'parallel' (a pool of spawned workers, also on the CPU,
            and one worker where there is one slot).
        devices: 'auto' (every visible GPU, else one CPU slot), a count N (GPUs 0..N-1, or N CPU slots without CUDA), or a list of GPU ids.
        workers_per_device: workers sharing each device (several small clients can share one large GPU); 'auto'
            sizes it before round 0 from the GPUs' free memory and the largest model (:meth:`Executor.size_workers`,
            called by the in-process clients of a simulation), 1 on a CPU and in a Flower deployment's server.
        threads_per_worker: torch CPU threads in every task, sequential included; None splits this machine's cores among the workers. Equal values give bit-identical results across executors.
    """

    kind: Literal["auto", "sequential", "parallel"] = "auto"
    devices: Union[Literal["auto"], int, list[int]] = "auto"
    workers_per_device: Union[Literal["auto"], int] = "auto"
    threads_per_worker: Optional[int] = None

    def __post_init__(self) -> None:
        """Raises ConfigError for a value out of range (whether GPU ids exist is
        :func:`~cosmos_pl.execution.devices.resolve_devices`'s check)."""
        d = self.devices
        check(d == "auto" or (isinstance(d, int) and d >= 1) or (isinstance(d, list) and d and min(d) >= 0),
              "executor.devices", d, "use 'auto', a count >= 1, or a non-empty list of GPU ids >= 0")
        w = self.workers_per_device
        check(w == "auto" or (isinstance(w, int) and w >= 1), "executor.workers_per_device", w,
              "must be >= 1, or 'auto' (sized from the GPUs' free memory)")
        check(self.threads_per_worker is None or self.threads_per_worker >= 1, "executor.threads_per_worker",
              self.threads_per_worker, "must be >= 1, or null to split this machine's cores among the workers")


class TaskTimeout(Exception):
    """A task ran past ``failures.timeout_s``."""


# Errors in the settings or the data, and a GPU out of memory, are the user's to fix, not a client's failure: they
# always stop the run.
_FATAL = (ConfigError, DataError, DeviceMemoryError)


def _describe(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:500]


def _out_of_memory(err: BaseException) -> bool:
    """A stage's own out-of-memory error, or a CUDA error that is one (:func:`cuda_error_kind`)."""
    return isinstance(err, DeviceMemoryError) or cuda_error_kind(err) == OUT_OF_MEMORY


def _on_gpu(gpu: Optional[int]) -> contextlib.AbstractContextManager:
    """Run the enclosed tasks in this process on GPU ``gpu`` (CUDA's current device, which is what ``cuda`` means
    to torch and to every stage's Trainer, :func:`~cosmos_pl.training.engine.make_trainer`); nothing for the CPU
    (``gpu`` None) or where CUDA cannot start (the stages then run on the CPU, as ``trainer.accelerator: auto``
    says)."""
    return torch.cuda.device(gpu) if gpu is not None and torch.cuda.is_available() else contextlib.nullcontext()


#: The variable giving the Inductor compile threads (``trainer.compile``) of a process started with it.
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


@contextlib.contextmanager
def _compile_threads() -> Iterator[None]:
    """A worker started inside this block compiles with one thread (:data:`COMPILE_THREADS` 1, unless set
    already): by default each worker's Inductor would start a pool of about one compile process per core, N pools for
    N workers. Torch reads the variable when its Inductor config is first imported, so it is given to the worker's
    environment before it starts; this process's environment is left as it was."""
    before = os.environ.get(COMPILE_THREADS)
    os.environ[COMPILE_THREADS] = before or "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[COMPILE_THREADS]
        else:
            os.environ[COMPILE_THREADS] = before


def _worker_main(conn: Connection, gpu: Optional[int], threads: int) -> None:
    """A worker process: run ``(index, fn, kwargs, returns_model, stage)`` messages until ``None`` arrives, replying
    ``(index, True, model, output)`` or ``(index, False, exits, exception)``. Resident tensors
    (:meth:`Executor.keep_resident`) and architectures are kept for the worker's life, a stage's shared models until
    the next stage. A task that leaves the worker's CUDA context unusable is the worker's last: it replies with
    ``exits`` True, then exits, and the executor starts a fresh one (every later task here would fail the same way)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle (it stops the workers)
    torch.set_num_threads(threads)
    problem = None if gpu is None else _pinning_problem(gpu)
    held: dict[str, Any] = {}  # resident tensors, model architectures and the stage's shared models, by name
    stage_now = None
    while True:
        try:
            message = receive(conn)
        except EOFError:
            return
        if message is None:
            return
        index, fn, kwargs, returns_model, stage = message
        if stage != stage_now:
            for name in [n for n in held if n.startswith(STAGE_PREFIX)]:
                del held[name]
            stage_now = stage
        kwargs, sent = unpack(kwargs, held)
        send(conn, (index, None, None, None))  # started: the timeout counts from here, not from the worker's start-up
        if problem is not None:  # a worker that sees the wrong GPUs runs nothing: every task stops the run
            send(conn, (index, False, None, ConfigError(problem)))
            continue
        # every model arrived by value: the task trains the worker's own copy, the caller's model stays untouched
        try:
            out = fn(**kwargs)
            # a trained model changed in this process: send it back; a read-only one need not travel again
            reply = (index, True, trained_reply(kwargs.get("model"), sent, held) if returns_model else None, out)
        except BaseException as err:  # sent back whole when it pickles, so the main process re-raises the same type
            reply = (index, False, cuda_error_kind(err) == BROKEN_CONTEXT, err)
        exits = not reply[1] and reply[2]
        try:
            send(conn, reply)
        except Exception as err:  # an exception that does not pickle
            send(conn, (index, False, exits, RuntimeError(_describe(reply[3]) if not reply[1] else _describe(err))))
        if exits:
            sys.stderr.flush()
            os._exit(1)  # no clean-up that might touch the broken CUDA context


def _pinning_problem(gpu: int) -> Optional[str]:
    """In a worker pinned to GPU ``gpu`` (its ``CUDA_VISIBLE_DEVICES`` set before it started): None when it sees
    exactly one GPU (logged to stderr, with its name), else what it sees instead."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count()
    if count == 1:
        print(f"cosmos-pl worker {os.getpid()}: GPU {visible} ({torch.cuda.get_device_name(0)})", file=sys.stderr)
        return None
    return (f"executor: the worker for GPU {gpu} (CUDA_VISIBLE_DEVICES={visible}) sees {count} GPUs, not 1: "
            "something in the environment resets CUDA_VISIBLE_DEVICES; give executor.devices GPU ids that exist")


@dataclass(eq=False)
class _Worker:
    process: Any
    conn: Connection
    gpu: Optional[int]
    task: Optional[int] = None
    started: Optional[float] = None  # when the worker began the task (None: not yet)
    held: set = field(default_factory=set)  # the resident tensors it has been sent (by name)


@contextlib.contextmanager
def _alarm(seconds: Optional[float]):
    """Raise :class:`TaskTimeout` in this (main) thread after ``seconds``; a no-op without a limit or off the main
    thread. Python checks signals between bytecodes, so a long native call ends before the timeout fires."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
        raise TaskTimeout(f"ran past failures.timeout_s = {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Executor:
    """Runs a stage's tasks; ``map`` yields ``(index, model, output)`` as tasks finish.

    Each task is ``(fn, kwargs)``; ``fn`` trains or reads ``kwargs["model"]`` and returns a small output. With
    ``returns_model`` the trained model is yielded too; it is always a copy (a worker's, or a deep copy in
    sequential mode), so the caller's model stays as it was until it takes the new one, and a failed task leaves
    nothing half-trained behind.

    Parallel mode runs its own worker processes (``spawn``), one task each at a time, so it knows which task a
    worker held: a worker that dies (segfault, OOM kill), runs past the timeout or hits a CUDA error that leaves its
    CUDA context unusable fails that task only and is replaced; the other tasks go on. Where several workers share a
    GPU (``workers_per_device`` > 1), a task that runs out of GPU memory (perhaps at a neighbour's peak) is tried once
    more on a fresh worker before it stops the run. Tasks that run in this process use the first slot's GPU.
    """

    def __init__(self, cfg: ExecutorConfig, accelerator: str = "auto") -> None:
        w = cfg.workers_per_device
        if w != "auto" and not (isinstance(w, int) and w >= 1):
            raise ConfigError(f"executor.workers_per_device={w}: must be >= 1, or 'auto'")
        self.cfg = cfg
        self.devices = resolve_devices(cfg.devices, accelerator)
        self._set_workers_per_device(1 if w == "auto" else w)
        self._workers: list[_Worker] = []
        self.replaced_workers = 0
        self.retried_tasks = 0  # tasks tried again after running a shared GPU out of memory
        self._resident = Residents()
        self.resident_sends = 0  # resident tensors and model architectures sent to workers whole, once per worker
        self.shared_memory = SHARED  # how workers get the resident tensors (plan_shared_memory)
        self._stage = 0  # numbers the parallel stages: a worker keeps a stage's shared models until the next one
        self._templates: dict[str, Template] = {}  # every architecture sent to a worker (transfer.pack)

    def keep_resident(self, name: str, tensor: torch.Tensor) -> None:
        """Register ``tensor`` (a client's data, U: what stays the same for the whole run) under ``name``: a task
        argument that is this very tensor goes to each worker once, and the worker keeps it for later tasks, across
        stages and rounds (:mod:`cosmos_pl.execution.transfer`). The tensor is tagged with ``name`` so that a stage
        on a GPU keeps one device copy of it (``cosmos_pl.training.engine``). It must not change afterwards.

        Raises:
            ValueError: ``name`` already names another tensor."""
        self._resident.add(name, tensor)

    def plan_shared_memory(self) -> Optional[str]:
        """Before the workers start: whether the resident tensors registered so far fit in ``/dev/shm`` to be
        shared by the workers (:func:`~cosmos_pl.execution.devices.shared_memory_plan`); where they do not and the
        workers were this executor's own choice, each worker gets its own copy, or, where memory is short for that,
        the tasks run in this process. Returns the line that says so (None when shared, or not parallel).

        Raises:
            ConfigError: they do not fit and the parallel workers were asked for (``executor.kind: parallel`` or a
                number of ``workers_per_device``)."""
        if not self.parallel or self._workers:
            return None
        explicit = self.cfg.kind == "parallel" or self.cfg.workers_per_device != "auto"
        mode, line = shared_memory_plan(self._resident.nbytes(), shared_memory_free(), len(self.slots),
                                        explicit=explicit, available=memory_available())
        self.shared_memory = mode
        if mode == SEQUENTIAL:
            self.parallel = False
            self.threads = worker_threads(self.cfg.threads_per_worker, 1)
        return line

    def _set_workers_per_device(self, per_device: int) -> None:
        self.workers_per_device = per_device
        self.slots = self.devices * per_device
        on_gpus = any(slot is not None for slot in self.slots)
        # parallel asked for: workers, one where there is one slot; auto: workers where there are GPUs to spread over,
        # else this process (on a GPU other than cuda:0 too, made the current device while its tasks run: _on_gpu)
        self.parallel = self.cfg.kind == "parallel" or (self.cfg.kind == "auto" and on_gpus and len(self.slots) > 1)
        self.threads = worker_threads(self.cfg.threads_per_worker, len(self.slots) if self.parallel else 1)

    def size_workers(self, parameters: int, data_bytes: int, tasks: int) -> Optional[str]:
        """``workers_per_device: auto`` on GPUs, before any worker starts: set the workers per GPU
        (:func:`~cosmos_pl.execution.devices.workers_per_gpu`: from the GPUs' free memory, for a largest model of
        ``parameters`` and ``data_bytes`` kept on the GPU and a stage of at most ``tasks`` tasks); return the line
        that says so. None (and one worker per device) on a CPU or with a number given. Without ``nvidia-smi`` one
        worker per GPU, said so. With ``kind: sequential`` nothing runs in workers, and nothing is sized."""
        gpus = [slot for slot in self.devices if slot is not None]
        if self.cfg.workers_per_device != "auto" or not gpus or self.cfg.kind == "sequential" or self._workers:
            return None
        per_device, line = workers_per_gpu(gpus, parameters, data_bytes, tasks)
        self._set_workers_per_device(per_device)
        return line

    # ------------------------------------------------------------------ workers
    def _spawn(self, gpu: Optional[int]) -> _Worker:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_worker_main, args=(child, gpu, self.threads), daemon=True)
        # pinned before the child exists: spawn copies the environment at start, so the worker sees only its GPU
        # (as cuda:0) from its first import on, whatever touches CUDA while it imports
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = physical_gpu(gpu)
        try:
            with _compile_threads():
                process.start()
        finally:
            if gpu is not None:
                if before is None:
                    del os.environ["CUDA_VISIBLE_DEVICES"]
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = before
        child.close()
        return _Worker(process, parent, gpu)

    def _replace(self, worker: _Worker) -> None:
        """Stop ``worker`` (it died or hangs) and start a fresh one on the same device slot."""
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=10)
        worker.conn.close()
        slot = next(k for k, w in enumerate(self._workers) if w is worker)
        self._workers[slot] = self._spawn(worker.gpu)
        self.replaced_workers += 1

    def _start(self) -> None:
        if not self._workers:
            self._workers = [self._spawn(gpu) for gpu in self.slots]

    # ------------------------------------------------------------------ map
    def map(self, tasks: Sequence[Task], costs: Optional[Sequence[float]] = None, *, returns_model: bool = False,
            tolerate: bool = False, timeout_s: Optional[float] = None) -> Iterator[tuple[int, Any, Any]]:
        """Run ``tasks``; yield ``(index, model, output)`` in completion order.

        Args:
            tasks: ``(fn, kwargs)`` pairs.
            costs: estimated cost per task; the largest start first (parallel mode).
            returns_model: yield the trained ``kwargs["model"]`` (a copy) as ``model``.
            tolerate: a task that raises (anything but a ConfigError, DataError or GPU out of memory, or, in this
                process, a CUDA error that leaves its context unusable), runs past ``timeout_s`` or loses its worker
                yields ``(index, None, TaskFailure(reason))`` instead of stopping the stage.
            timeout_s: seconds one task may run (None: no limit).

        Raises:
            Exception: the task's own exception when not ``tolerate`` (a ConfigError or DataError even then).
            RuntimeError: a lost worker or a timeout when not ``tolerate``.
            DeviceMemoryError: a task ran the GPU out of memory (where workers share a GPU: twice).
            DeviceError: a task in this process left its CUDA context unusable.
        """
        if not self.parallel:
            yield from self._sequential(tasks, returns_model, tolerate, timeout_s)
        else:
            yield from self._parallel(tasks, costs, returns_model, tolerate, timeout_s)

    def _failed(self, index: int, err: BaseException, *, tolerate: bool,
                in_process: bool = False) -> tuple[int, Any, Any]:
        if isinstance(err, _FATAL):
            raise err
        kind = cuda_error_kind(err)
        if kind == OUT_OF_MEMORY:  # outside a stage's own check (moving data or a model, a cuBLAS or cuDNN call)
            raise DeviceMemoryError(
                f"a task ran the GPU out of memory ({_describe(err)[:200]}); run fewer workers per GPU "
                "(executor.workers_per_device), or lower the clients' data on the GPU with smaller models or "
                "trainer.precision=bf16-mixed") from None
        if too_many_open_files(err):  # the session's limit, not the client's failure: every client would hit it
            raise ResourceLimitError(open_file_limit_line()) from None
        if kind == BROKEN_CONTEXT and in_process:  # every later task in this process would fail the same way
            raise DeviceError(
                f"executor: a task hit a CUDA error that leaves this process's CUDA context unusable "
                f"({_describe(err)[:200]}), so the run stops; a device-side assert is most often a label or an index "
                "out of range (CUDA_LAUNCH_BLOCKING=1 names the operation); with executor.kind parallel a worker that "
                "hits one is replaced and only its task fails") from None
        if not tolerate:
            raise err
        return index, None, TaskFailure(_describe(err))

    def _sequential(self, tasks, returns_model, tolerate, timeout_s):
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with _on_gpu(self.slots[0]):  # the first slot's GPU: executor.devices [1] runs on GPU 1
                for i, (fn, kwargs) in enumerate(tasks):
                    signals.check()  # a safe point: a stop request whose exception was lost stops here
                    if returns_model and kwargs.get("model") is not None:
                        kwargs = {**kwargs, "model": copy.deepcopy(kwargs["model"])}
                    try:
                        with _alarm(timeout_s):
                            out = fn(**kwargs)
                    except Exception as err:  # KeyboardInterrupt and signals pass through
                        signals.check(err)  # an error during a stop is the stop's, not a failure of the client
                        yield self._failed(i, err, tolerate=tolerate, in_process=True)
                        continue
                    signals.check()  # a task that ran on past a stop request is not used
                    yield i, kwargs.get("model"), out
        finally:
            torch.set_num_threads(previous)

    def _parallel(self, tasks, costs, returns_model, tolerate, timeout_s):
        if self.shared_memory == SHARED:
            self._resident.share()  # those registered since the last stage, into an arena of their own
        self._start()
        for worker in list(self._workers):
            if worker.task is not None:  # left busy by a stage that stopped on an error: its result is stale
                self._replace(worker)
        self._stage += 1
        for worker in self._workers:  # each worker drops the last stage's models when this stage's first task comes
            worker.held = {n for n in worker.held if not n.startswith(STAGE_PREFIX)}
        repeated = repeated_models(tasks, trains=returns_model)
        restarts = 0
        retried: set[int] = set()  # tasks tried again after running a shared GPU out of memory
        # largest estimated cost first, so a big task does not start last and leave workers idle
        pending = sorted(range(len(tasks)), key=lambda i: -(costs[i] if costs else 0.0))
        busy: dict[int, _Worker] = {}
        while pending or busy:
            signals.check()  # a safe point: a stop request whose exception was lost stops here
            for worker in self._workers:
                if worker.task is None and pending:
                    i = pending.pop(0)
                    fn, kwargs = tasks[i]
                    kwargs, new = pack(kwargs, self._resident, worker.held, self._templates, self._stage, repeated,
                                       trains=returns_model)
                    try:
                        send(worker.conn, (i, fn, kwargs, returns_model, self._stage))
                    except (BrokenPipeError, EOFError, OSError) as err:  # the worker died while idle
                        restarts += 1
                        if restarts > 3 * len(self._workers):
                            raise RuntimeError(f"worker processes keep dying before they get a task ({err})") from None
                        self._replace(worker)
                        pending.insert(0, i)
                        continue
                    worker.held.update(new)
                    self.resident_sends += sum(not n.startswith(STAGE_PREFIX) for n in new)
                    worker.task, worker.started = i, None
                    busy[i] = worker
            if not busy:
                continue
            waits = [w.conn for w in busy.values()] + [w.process.sentinel for w in busy.values()]
            limit = None
            running = [w.started for w in busy.values() if w.started is not None]
            if timeout_s and running:
                limit = max(0.0, min(running) + timeout_s - time.monotonic())
            ready = set(wait(waits, timeout=limit))
            signals.check()
            for i, worker in list(busy.items()):
                reply = None
                if worker.conn in ready:
                    try:
                        reply = receive(worker.conn)
                    except (EOFError, OSError):
                        reply = None
                if reply is not None and reply[1] is None:  # the worker has begun the task
                    worker.started = time.monotonic()
                elif reply is not None:
                    busy.pop(i)
                    worker.task = None
                    index, ok, model_or_exits, out = reply
                    if ok:
                        yield index, built(model_or_exits, self._templates), out
                        continue
                    if model_or_exits:  # the worker exits after this reply: its CUDA context is unusable
                        self._replace(worker)
                    if self.workers_per_device > 1 and index not in retried and _out_of_memory(out):
                        # perhaps a neighbour's peak on the shared GPU: once more, on a fresh worker (one that holds
                        # no GPU memory of its own yet); a second time stops the run
                        retried.add(index)
                        self.retried_tasks += 1
                        if not model_or_exits:
                            self._replace(worker)
                        pending.insert(0, index)
                        continue
                    yield self._failed(index, out, tolerate=tolerate)
                elif worker.process.sentinel in ready or not worker.process.is_alive():
                    busy.pop(i)
                    worker.process.join(timeout=10)
                    code = worker.process.exitcode
                    self._replace(worker)
                    yield self._failed(i, RuntimeError(f"the worker process running it died (exit code {code})"),
                                       tolerate=tolerate)
                elif timeout_s and worker.started is not None and time.monotonic() - worker.started > timeout_s:
                    busy.pop(i)
                    self._replace(worker)
                    yield self._failed(i, TaskTimeout(f"ran past failures.timeout_s = {timeout_s:g} s"),
                                       tolerate=tolerate)

    def close(self) -> None:
        """Stop the workers (idle ones exit at once; busy ones are killed)."""
        for worker in self._workers:
            try:
                if worker.task is None:
                    send(worker.conn, None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.conn.close()
        self._workers = []
