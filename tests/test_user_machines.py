"""A parallel fit on the machines users have, not only this project's: under an open-file limit of 1,024 (a desktop,
a container, a Slurm node) and in Docker's 64 MB ``/dev/shm``, both at once in one real ``cosmos-pl fit`` in a child
process with two worker processes, giving the sequential run's numbers byte for byte; and the open-file limit raised
at start, or said in one line where it is hit."""

import errno
import os
import resource
import shutil
import subprocess
import sys

import pytest

from cosmos_pl.limits import open_file_limit_line, raise_open_file_limit, too_many_open_files
from conftest import PROCESS_TIMEOUT_S, small_digits_argv

PARALLEL = ("--executor.kind", "parallel", "--executor.devices", "2")


def _fit(argv, prefix=(), limit=None, timeout=PROCESS_TIMEOUT_S):
    """``cosmos-pl fit`` in a child process (after ``prefix``, e.g. a namespace), its open-file limit set before it
    starts."""
    def set_limit():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return subprocess.run([*prefix, sys.executable, "-m", "cosmos_pl.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=set_limit, env={**os.environ, "COLUMNS": "120"})


def _same_numbers(run_dir, reference):
    for name in ("metrics.csv", "clients.csv"):
        assert (run_dir / name).read_text() == (reference / name).read_text(), name


def _private_shm_prefix(size: str, usage_log) -> tuple[list[str], str]:
    """``(prefix, "")``: the command prefix of a private mount namespace whose /dev/shm is a new tmpfs of ``size`` (as
    Docker gives a container), its used KiB written to ``usage_log`` every 50 ms while the command runs; or ``([],
    why)`` where this cannot be made (not root, no unshare, a sandbox that refuses mounts)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return [], "a private /dev/shm needs root and unshare (util-linux): CI runs as root"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs -o size={size} tmpfs /dev/shm && df -k /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return [], f"cannot mount a private /dev/shm here: {probe.stderr.strip()[:200]}"
    # mounted before the command and its watch start: a `df` that ran before the mount would read the machine's own
    # /dev/shm, where other processes (other tests' runs) keep their shared memory
    watch = (f'mount -t tmpfs -o size={size} tmpfs /dev/shm || exit 97; "$@" & pid=$!; '
             "while kill -0 $pid 2>/dev/null; do "
             f"df -k /dev/shm | awk 'NR==2 {{print $3}}' >> {usage_log}; sleep 0.05; done; wait $pid")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", watch, "sh"], ""


@pytest.mark.slow
def test_a_parallel_fit_under_1024_open_files_in_a_64mb_shm_gives_the_sequential_numbers(repo_root, tmp_path,
                                                                                       small_digits_run):
    # every stage of a PTC and an IFFT round on 2 workers, with soft and hard open-file limits of 1,024 (ulimit -n
    # 1024) and, where this machine can make one (root), in a private 64 MB /dev/shm (Docker's default), against the
    # same run made sequentially in this process (conftest's small_digits_run). One run holds both limits, as a
    # container often does; a failure's message says which limit it met.
    run_dir, usage = tmp_path / "parallel", tmp_path / "shm-kib.txt"
    prefix, why = _private_shm_prefix("64m", usage)
    if why:  # the open-file limit is still checked, the /dev/shm size is not
        print(f"/dev/shm left as it is: {why}")
    done = _fit(small_digits_argv(repo_root, run_dir, *PARALLEL), prefix=prefix, limit=1024)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "shared memory" not in done.stdout  # it fits: no fallback, no refusal
    _same_numbers(run_dir, small_digits_run)
    if prefix:
        # only the resident data is in /dev/shm: at most the 1,797 digits (64 one-byte pixels and an int64 label
        # each) and 64 bytes of alignment for each of the 5 clients' 6 tensors and U, about 131 KB; models, targets
        # and results cross the pipes (torch's own sharing held about 45 MiB here for digits_smoke's 10 clients)
        assert max(int(v) for v in usage.read_text().split()) < 1024, "KiB of /dev/shm in use"
    else:
        pytest.skip(f"the open-file limit passed; {why}")


def test_the_soft_open_file_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip(f"the hard limit here ({hard}) leaves nothing to raise from 1,024")
    done = subprocess.run([sys.executable, "-c", "import resource; from cosmos_pl.limits import raise_open_file_limit;"
                           "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))"],
                          capture_output=True, text=True, preexec_fn=lambda: resource.setrlimit(
                              resource.RLIMIT_NOFILE, (1024, hard)))
    assert done.stdout.split("\n")[0] == f"(1024, {hard}) ({hard}, {hard})", done.stderr
    assert raise_open_file_limit() is None  # this process: already at its hard limit (pytest or an earlier call)


def test_running_out_of_descriptors_is_one_line_naming_ulimit(monkeypatch, capsys):
    import cosmos_pl.cli as cli
    from cosmos_pl.execution.executor import Executor, ExecutorConfig
    from cosmos_pl.limits import ResourceLimitError

    err = OSError(errno.EMFILE, "Too many open files")
    assert too_many_open_files(err) and too_many_open_files(RuntimeError("unable to open shared memory object "
                                                                         "<torch_1>: Too many open files (24)"))
    assert not too_many_open_files(OSError(errno.ENOENT, "No such file"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(4096, 4 * soft)
    expected = (f"too many open files: this process may hold {soft} (ulimit -n; hard limit {hard}); run "
                f"`ulimit -n {need}` in the shell before cosmos-pl")
    if hard < need:
        expected += (f", which needs a hard limit of {need} or more: ask your administrator (nofile in "
                     "/etc/security/limits.conf, LimitNOFILE in systemd, or the container's --ulimit nofile)")
    assert open_file_limit_line() == expected

    def out_of_descriptors(argv):
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as first:
            raise RuntimeError("a worker could not start") from first

    monkeypatch.setattr(cli, "run", out_of_descriptors)
    assert cli.main(["fit"]) == 2
    assert capsys.readouterr().err.strip() == f"cosmos-pl: error: {expected}"  # no traceback, not "internal error"

    # a task that runs out is not a client's failure (every client would): the stage stops with the same line
    def task():
        raise OSError(errno.EMFILE, "Too many open files")

    ex = Executor(ExecutorConfig(kind="sequential"), "cpu")
    with pytest.raises(ResourceLimitError, match="too many open files"):
        list(ex.map([(task, {})], tolerate=True))
