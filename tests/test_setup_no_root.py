"""Set-up without root: `make data` (tools/fashion_mnist.sh) installs Debian's dataset-fashion-mnist where this user
may (root, or sudo without a password), else says in one line that cosmos-pl downloads the data on first use and
succeeds; a real apt-get error still fails it. Run with a PATH of only the tools named (links to the real sh, id,
env, make, and fake apt-get, sudo and id that record how they were called) and the Debian folder moved to a temp
path. And `make demo TORCH_BACKEND=cu126` hands the backend to uv; and make test's Slurm packages
(tools/slurm_packages.sh) install as root with their services kept from starting, else one line, never a failure."""

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


# ------------------------------------------------------------------ make test's Slurm packages (tools/slurm_packages.sh)
SLURM_PACKAGES = "slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
SLURM_BINARIES = ("slurmctld slurmd slurmdbd sbatch squeue sacct sacctmgr scontrol munged mungekey mariadbd "
                  "mariadb-install-db").split()
SLURM_INSTALL = f"DEBIAN_FRONTEND=noninteractive install -y -q --no-install-recommends {SLURM_PACKAGES}"
SKIP_LINE = f"Slurm: installing {SLURM_PACKAGES} needs root and apt-get; the slurm_cluster tests will skip\n"


def slurm_apt_get(bin_dir: Path, log: Path, policy: Path, fail_install: str = "never") -> None:
    """A fake apt-get: records each call, and on install what policy-rc.d held then; ``install`` puts a fake of
    every Slurm binary in ``bin_dir`` unless ``fail_install`` is "always" or "before update"."""
    fails = {"never": "false", "always": "true", "before update": f"[ ! -f {log}.updated ]"}[fail_install]
    fake(bin_dir, "apt-get", f'echo "DEBIAN_FRONTEND=${{DEBIAN_FRONTEND:-}} $*" >> {log}\n'
                             f'[ "$1" = update ] && : > {log}.updated\n'
                             f'if [ "$1" = install ]; then\n'
                             f'  echo "policy-rc.d: $(cat {policy} 2>/dev/null | tail -n 1)" >> {log}\n'
                             f'  if {fails}; then echo "E: Unable to locate package slurmctld" >&2; exit 100; fi\n'
                             f'  for b in {" ".join(SLURM_BINARIES)}; do printf "#!/bin/sh\\n" > {bin_dir}/$b; '
                             f'{shutil.which("chmod")} 755 {bin_dir}/$b; done\n'
                             f'fi\n'
                             f'exit 0\n')


def slurm_packages(tmp_path: Path, bin_dir: Path, uid: int) -> subprocess.CompletedProcess:
    """tools/slurm_packages.sh with the PATH ``bin_dir`` only (the real sh, chmod, rm, cat, tail and a fake ``id``
    saying ``uid``), policy-rc.d at tmp_path/policy-rc.d and no system folder searched for the daemons."""
    for tool in ("sh", "chmod", "rm", "cat", "tail"):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    fake(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}\n')
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "LC_ALL": "C", "SBIN": "",
           "POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    return subprocess.run(["sh", str(ROOT / "tools/slurm_packages.sh")], env=env, capture_output=True, text=True,
                          timeout=60)


def test_slurm_packages_without_root_say_the_tests_will_skip(tmp_path, bin_dir):
    log = tmp_path / "calls"
    slurm_apt_get(bin_dir, log, tmp_path / "policy-rc.d")
    proc = slurm_packages(tmp_path, bin_dir, uid=1000)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, SKIP_LINE, "")
    assert not log.exists()


def test_slurm_packages_install_with_services_kept_from_starting_then_nothing_to_do(tmp_path, bin_dir):
    """As root: apt-get update only after an install that failed; while apt-get installs, policy-rc.d says
    `exit 101` (no service starts), and it is gone afterwards; once the binaries are there, nothing runs."""
    log = tmp_path / "calls"
    slurm_apt_get(bin_dir, log, tmp_path / "policy-rc.d", fail_install="before update")
    proc = slurm_packages(tmp_path, bin_dir, uid=0)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stderr
    assert log.read_text().splitlines() == [SLURM_INSTALL, "policy-rc.d: exit 101", "DEBIAN_FRONTEND= update -qq",
                                            SLURM_INSTALL, "policy-rc.d: exit 101"]
    assert not (tmp_path / "policy-rc.d").exists()
    proc = slurm_packages(tmp_path, bin_dir, uid=0)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert len(log.read_text().splitlines()) == 5


def test_slurm_packages_keep_a_policy_rc_d_that_was_there_and_never_fail(tmp_path, bin_dir):
    log = tmp_path / "calls"
    (tmp_path / "policy-rc.d").write_text("#!/bin/sh\n# the container's own\nexit 101\n")
    slurm_apt_get(bin_dir, log, tmp_path / "policy-rc.d", fail_install="always")
    proc = slurm_packages(tmp_path, bin_dir, uid=0)
    assert proc.returncode == 0 and "E: Unable to locate package slurmctld" in proc.stderr
    assert proc.stdout == (f"Slurm: apt-get install {SLURM_PACKAGES} failed (exit 100); the slurm_cluster tests "
                           f"will skip\n")
    assert (tmp_path / "policy-rc.d").read_text() == "#!/bin/sh\n# the container's own\nexit 101\n"


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
