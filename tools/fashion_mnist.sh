#!/bin/sh
# `make data`: Fashion-MNIST for the demo and the tests. Debian's package dataset-fashion-mnist where this user may
# install it (offline once installed, and shared by every checkout and user of the machine). Anywhere else (no root
# and no sudo without a password, or no apt-get: an HPC login node, Fedora, a conda environment) cosmos-pl downloads
# the same four files itself on first use (cosmos_pl/data/datasets/packaged.py), so this step says so in one line
# and succeeds: nothing that follows needs root.
#
# FMNIST_DIR: where the package puts the files (cosmos_pl.data.FashionMNIST.SYSTEM_DIR); the tests point it at a
# missing folder. An apt-get that fails for a user who may install is a real error and fails the step.
set -eu

FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
PACKAGE=dataset-fashion-mnist
# what cosmos-pl reads where the package is absent: torchvision's folder under the configs' `root: data`
DOWNLOAD_DIR=data/FashionMNIST/raw

# the package installs the four files together; the loader needs all four
have_files() {
    for stem in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        [ -f "$FMNIST_DIR/$stem.gz" ] || return 1
    done
}

have_files && exit 0

# the line a user who cannot install the package sees: how the data will come, and the two other ways
without_package() {
    echo "Fashion-MNIST: $1; cosmos-pl downloads it into data/FashionMNIST on first use (needs network access)$2," \
         "or put the four IDX .gz files in $DOWNLOAD_DIR/"
}

if ! command -v apt-get >/dev/null 2>&1; then
    without_package "no apt-get here for Debian's $PACKAGE" ""
    exit 0
fi
# sudo -n: never wait for a password (make may run without a terminal); a sudo that asks for one counts as none
if [ "$(id -u)" = 0 ]; then
    SUDO=
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=sudo
else
    without_package "installing Debian's $PACKAGE needs root or sudo" \
        ", or ask an administrator to apt-get install $PACKAGE"
    exit 0
fi

# env: sudo passes no DEBIAN_FRONTEND of ours to apt-get
apt_install() {
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$PACKAGE"
}
# apt-get update only when the package lists do not know the package yet (it takes a while)
apt_install || { $SUDO apt-get update -qq && apt_install; }
if ! have_files; then
    echo "Fashion-MNIST: $PACKAGE is installed but $FMNIST_DIR lacks its files: apt-get install --reinstall $PACKAGE" >&2
    exit 1
fi
