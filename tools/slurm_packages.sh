#!/bin/sh
# `make test`: the packages of the one-node Slurm cluster the slurm_cluster tests start (tests/slurm_cluster.py):
# slurmctld, slurmd, the client commands (sbatch, squeue, sacct, scontrol), slurmdbd with MariaDB (submitit reads job
# states with sacct, which needs accounting) and munge. Installed with Debian's packages where this user is root and
# apt-get exists; their system services are kept from starting (policy-rc.d: the tests start their own daemons).
# Anywhere else one line says the slurm_cluster tests will skip. Never fails: a failed install is said in one line
# and the tests skip with the reason.
#
# SBIN: folders searched for the daemons besides PATH; POLICY_RC_D: Debian's policy-rc.d (the tests point both
# elsewhere).
set -u

PACKAGES="slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
BINARIES="slurmctld slurmd slurmdbd sbatch squeue sacct sacctmgr scontrol munged mungekey mariadbd mariadb-install-db"
PATH="$PATH:${SBIN-/usr/sbin:/sbin}"

have_binaries() {
    for b in $BINARIES; do
        command -v "$b" >/dev/null 2>&1 || return 1
    done
}

have_binaries && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "Slurm: installing $PACKAGES needs root and apt-get; the slurm_cluster tests will skip"
    exit 0
fi

# no service of these packages starts while they install (exit 101: "action forbidden"); a policy-rc.d already
# there (a container's own) is left as it is
POLICY=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
ours=
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$POLICY" && chmod 755 "$POLICY" && ours=1
fi
apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null
}
# apt-get update only when the package lists do not know the packages yet (it takes a while)
apt_install || { apt-get update -qq && apt_install; }
status=$?
[ -n "$ours" ] && rm -f "$POLICY"
if [ $status != 0 ] || ! have_binaries; then
    echo "Slurm: apt-get install $PACKAGES failed (exit $status); the slurm_cluster tests will skip"
fi
exit 0
