"""Set-up without root: `make data` (tools/fashion_mnist.sh) installs Debian's dataset-fashion-mnist where this user
may (root, or sudo without a password), else says in one line that cosmos-pl downloads the data on first use and
succeeds; a real apt-get error still fails it. Run with a PATH of only the tools named (links to the real sh, id,
env, make, and fake apt-get, sudo and id that record how they were called) and the Debian folder moved to a temp
path. And `make demo TORCH_BACKEND=cu126` hands the backend to uv."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
INSTALL = "DEBIAN_FRONTEND=noninteractive install -y -qq dataset-fashion-mnist"  # a fake apt-get's record of it
UPDATE = "DEBIAN_FRONTEND= update -qq"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed (make data runs it)")

NO_ROOT_LINE = ("Fashion-MNIST: installing Debian's dataset-fashion-mnist needs root or sudo; cosmos-pl downloads it "
                "into data/FashionMNIST on first use (needs network access), or ask an administrator to apt-get "
                "install dataset-fashion-mnist, or put the four IDX .gz files in data/FashionMNIST/raw/\n")


def fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def apt_get(bin_dir: Path, log: Path, debian: Path, fail_install: str = "never") -> None:
    """A fake apt-get: records each call (DEBIAN_FRONTEND and the arguments) in ``log``; ``install`` puts the four
    files in ``debian`` unless ``fail_install`` is "always" or "before update" (the package lists do not know it)."""
    fails = {"never": "false", "always": "true", "before update": f"[ ! -f {log}.updated ]"}[fail_install]
    files = " ".join(f"{debian}/{stem}.gz" for stem in STEMS)
    # the PATH holds only the tools named: mkdir and touch by their paths
    fake(bin_dir, "apt-get", f'echo "DEBIAN_FRONTEND=${{DEBIAN_FRONTEND:-}} $*" >> {log}\n'
                             f'[ "$1" = update ] && : > {log}.updated\n'
                             f'if [ "$1" = install ]; then\n'
                             f'  if {fails}; then echo "E: Unable to locate package $4" >&2; exit 100; fi\n'
                             f'  {shutil.which("mkdir")} -p {debian} && {shutil.which("touch")} {files}\n'
                             f'fi\n'
                             f'exit 0\n')


def make_data(tmp_path: Path, bin_dir: Path, uid: int | None) -> subprocess.CompletedProcess:
    """``make data`` with the Debian folder at tmp_path/debian, the PATH ``bin_dir`` (the real sh, env and make, and
    ``id`` saying ``uid``), and no make variables of a calling make (``make test``)."""
    for tool in ("sh", "env", "make"):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    if uid is not None:
        fake(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}\n')
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "LC_ALL": "C"}
    return subprocess.run(["make", "--no-print-directory", "-s", "data", f"FMNIST_DIR={tmp_path / 'debian'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    (tmp_path / "bin").mkdir()
    return tmp_path / "bin"


def test_without_apt_get_the_step_says_in_one_line_that_cosmos_pl_downloads_it(tmp_path, bin_dir):
    (bin_dir / "id").symlink_to(shutil.which("id"))
    proc = make_data(tmp_path, bin_dir, uid=None)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == ("Fashion-MNIST: no apt-get here for Debian's dataset-fashion-mnist; cosmos-pl downloads it "
                           "into data/FashionMNIST on first use (needs network access), or put the four IDX .gz files "
                           "in data/FashionMNIST/raw/\n")


@pytest.mark.parametrize("sudo", [None, "asks for a password"])
def test_without_root_or_sudo_apt_get_is_not_run_and_the_step_succeeds(tmp_path, bin_dir, sudo):
    log = tmp_path / "calls"
    apt_get(bin_dir, log, tmp_path / "debian")
    if sudo:  # sudo -n fails where sudo would ask for a password
        fake(bin_dir, "sudo", f'echo "sudo $*" >> {log}\n[ "$1" = -n ] && {{ echo "sudo: a password is required" >&2;'
                              f" exit 1; }}\nexec \"$@\"\n")
    proc = make_data(tmp_path, bin_dir, uid=1000)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, NO_ROOT_LINE, "")
    assert (log.read_text().splitlines() if log.exists() else []) == (["sudo -n true"] if sudo else [])
    assert not (tmp_path / "debian").exists()


def test_as_root_it_installs_debians_package_once(tmp_path, bin_dir):
    log = tmp_path / "calls"
    apt_get(bin_dir, log, tmp_path / "debian")
    proc = make_data(tmp_path, bin_dir, uid=0)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert log.read_text().splitlines() == [INSTALL]
    # the files are there now: the next make does nothing
    proc = make_data(tmp_path, bin_dir, uid=0)
    assert (proc.returncode, proc.stdout, proc.stderr, log.read_text().splitlines()) == (0, "", "", [INSTALL])


def test_with_sudo_it_installs_through_sudo(tmp_path, bin_dir):
    log = tmp_path / "calls"
    apt_get(bin_dir, log, tmp_path / "debian")
    # as sudo, it finds `true` in the system's folders (and apt-get, the fake, first)
    fake(bin_dir, "sudo", f'echo "sudo $*" >> {log}\n[ "$1" = -n ] && shift\nPATH=$PATH:/usr/bin:/bin exec "$@"\n')
    proc = make_data(tmp_path, bin_dir, uid=1000)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert log.read_text().splitlines() == [
        "sudo -n true", "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist",
        INSTALL]


def test_apt_get_update_only_when_the_package_lists_do_not_know_the_package(tmp_path, bin_dir):
    log = tmp_path / "calls"
    apt_get(bin_dir, log, tmp_path / "debian", fail_install="before update")
    proc = make_data(tmp_path, bin_dir, uid=0)
    assert (proc.returncode, proc.stdout) == (0, "")
    assert log.read_text().splitlines() == [INSTALL, UPDATE, INSTALL]
    assert sorted(p.name for p in (tmp_path / "debian").iterdir()) == sorted(f"{s}.gz" for s in STEMS)


def test_a_real_apt_get_error_fails_the_step(tmp_path, bin_dir):
    log = tmp_path / "calls"
    apt_get(bin_dir, log, tmp_path / "debian", fail_install="always")
    proc = make_data(tmp_path, bin_dir, uid=0)
    assert proc.returncode != 0 and "E: Unable to locate package dataset-fashion-mnist" in proc.stderr
    assert "downloads it" not in proc.stdout
    assert log.read_text().splitlines() == [INSTALL, UPDATE, INSTALL]


def make_dry_run(*variables: str) -> list[str]:
    """The lines of uv's install that ``make -n demo`` (a fresh venv in a temp path) would run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in ("MFLAGS", "TORCH_BACKEND")}
    proc = subprocess.run(["make", "--no-print-directory", "-n", "demo", "VENV=/nonexistent/venv", *variables],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if "uv pip install" in line]


def test_torch_backend_is_handed_to_uv_and_not_retried_with_pip():
    (line,) = make_dry_run("TORCH_BACKEND=cu126")
    assert "--torch-backend cu126 --reinstall-package torch --reinstall-package torchvision" in line
    assert line.endswith("torch==2.14.1 torchvision==0.29.1 -e .")
    assert "installing with pip" not in line  # pip would install the default (CUDA 13.0) build
    (line,) = make_dry_run()  # the default: the configured index's build, pip if uv fails
    assert "--torch-backend" not in line and "--reinstall-package" not in line
    assert "uv failed: installing with pip" in line
