# Two commands for a fresh machine: `make demo` (train COSMOS on real Fashion-MNIST) and `make test`.
# Each creates the virtual environment .venv and installs what it needs; the data comes from Debian's package where this
# user may install it, else cosmos-pl downloads it on first use (tools/fashion_mnist.sh).

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# where Debian's dataset-fashion-mnist puts its files (cosmos_pl.data.FashionMNIST.SYSTEM_DIR)
FMNIST_DIR ?= /usr/share/datasets/fashion-mnist

.PHONY: demo test deploy-demo peers venv data slurm-packages clean gpu-wheels

venv: $(VENV)/.installed

# The demo needs the package only; the tests add the `test` and `flower` extras on top. torch is pinned to the
# release this project is tested with (CPU and CUDA alike). One install per target (one resolve). uv does it: it
# unpacks on every core (the CUDA torch wheels are about 6 GB unpacked), about 1.3 min here where pip took 3.8; it is
# installed from the same package indexes by pip, and given pip's index settings (tools/uv_index_args.py). Should uv
# fail, pip installs instead. Then bytecode on every core: where PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines) nothing else writes it, and every process would compile each module it imports again (as
# with pip, the few files that do not compile, templates and test data inside packages, are skipped).
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile
COMPILE     := $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
UV_INSTALL   = $(PIP_INSTALL) uv && $(VENV)/bin/uv pip install --quiet --python $(PY) $$($(PY) tools/uv_index_args.py) \
               $(if $(TORCH_BACKEND),--torch-backend $(TORCH_BACKEND))
INSTALL      = $(if $(TORCH_BACKEND),$(UV_INSTALL) $(2) $(1),{ $(UV_INSTALL) $(2) $(1) || { echo "uv failed: installing with pip"; $(PIP_INSTALL) $(1); }; })
TORCH       := torch==2.14.1 torchvision==0.29.1

# TORCH_BACKEND (e.g. `make demo TORCH_BACKEND=cu126`, or auto): the torch and torchvision build for this machine,
# taken from PyTorch's own index by uv's --torch-backend (cu126, cu128, cu130, cpu, rocm6.4, auto: what uv detects).
# Empty on a fresh machine: the configured index's default build; on Linux torch 2.14.1's default wheel is built for
# CUDA 13.0, which needs an NVIDIA driver >= 580, and an older driver needs e.g. cu126. pip has no such flag, so with
# a backend a uv failure is not retried with pip (pip would install the default build).
# The backend of the last install is kept in $(VENV)/.torch-backend and is the default of the next make (a later
# `make test` keeps the build `make demo TORCH_BACKEND=cu126` chose; `TORCH_BACKEND=` goes back to the default).
# Where the backend changes, the install is redone with torch and torchvision reinstalled (a 2.14.1 of another build
# satisfies ==2.14.1, so uv would keep it): the advice to add TORCH_BACKEND comes after a first install.
INSTALLED_BACKEND := $(shell cat $(VENV)/.torch-backend 2>/dev/null)
TORCH_BACKEND     ?= $(INSTALLED_BACKEND)
ifneq ($(TORCH_BACKEND),$(INSTALLED_BACKEND))
BACKEND_CHANGED   := FORCE
endif
REINSTALL_TORCH   := $(if $(BACKEND_CHANGED),--reinstall-package torch --reinstall-package torchvision)
FORCE:

$(VENV)/.installed: pyproject.toml $(BACKEND_CHANGED)
	$(PYTHON) -m venv $(VENV)
	$(call INSTALL,$(TORCH) -e .,$(REINSTALL_TORCH))
	$(COMPILE)
	echo '$(TORCH_BACKEND)' > $(VENV)/.torch-backend
	touch $@

# the tests cover the Flower transport too: the `flower` extra (flwr with its simulation engine) comes with them;
# on a fresh machine both targets' packages come in one install
TEST_EXTRAS := '.[test,flower,docs]'
$(VENV)/.installed-test: pyproject.toml $(BACKEND_CHANGED)
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(call INSTALL,$(TORCH) -e $(TEST_EXTRAS),$(REINSTALL_TORCH))
	$(COMPILE)
	echo '$(TORCH_BACKEND)' > $(VENV)/.torch-backend
	touch $(VENV)/.installed $@

# Debian's dataset-fashion-mnist where this user may install it (root, or sudo without a password), else one line:
# cosmos-pl downloads the same files on first use. Nothing to do where the files are there.
data:
	@FMNIST_DIR=$(FMNIST_DIR) sh tools/fashion_mnist.sh

# The one-node Slurm cluster the slurm_cluster tests start (tests/slurm_cluster.py): Debian's slurmctld, slurmd,
# slurm-client, slurmdbd, munge and mariadb-server where this user is root and has apt-get (their services kept from
# starting), else one line saying those tests will skip. Never fails; nothing to do where the binaries are there.
slurm-packages:
	@sh tools/slurm_packages.sh

demo: venv data
	$(VENV)/bin/cosmos-pl fit --config configs/fmnist_quickstart.yaml

# One worker more than cores: the Flower deployment test's worker mostly waits on its own processes (SuperLink,
# SuperNodes), which may use every core. --dist loadgroup: a module whose tests share a costly module fixture is one
# xdist_group, run by one worker; --no-loadscope-reorder keeps tests/conftest.py's order (the Flower tests first).
test: $(VENV)/.installed-test data slurm-packages
	$(PY) -m pytest -n $$(( $$(nproc) + 1 )) --dist loadgroup --no-loadscope-reorder

# The same federation run by cosmos-pl, Flower's simulation engine and FL-bench (FLBENCH: a checkout of
# KarhouTam/FL-bench; without it FL-bench is left out), one after another: benchmarks/peers/README.md. PEERS_ARGS:
# more flags of compare_peers.py (e.g. --repeat 3).
FLBENCH    ?=
PEERS_ARGS ?=
peers: $(VENV)/.installed data
	$(call INSTALL,$(TORCH) -e '.[flower,peers]')
	$(PY) benchmarks/peers/compare_peers.py $(if $(FLBENCH),--flbench $(FLBENCH)) $(PEERS_ARGS)

# A Flower deployment on localhost (TLS, SuperNode authentication, 3 sites each with only its own folder), two rounds
# of COSMOS, then everything it started is stopped: cosmos_pl/flower/localhost.py
deploy-demo: $(VENV)/.installed-test data
	$(PY) -m cosmos_pl.flower.localhost --out runs/deploy-demo

# For benchmarks/gpu_check.sh --offline on a GPU machine without network (docs/execution.md): the pure-Python wheels
# it lacks (jsonargparse, docstring-parser, typeshed-client), pinned to .venv's versions, into benchmarks/wheels
gpu-wheels: $(VENV)/.installed
	$(PY) benchmarks/gpu_offline.py download benchmarks/wheels

clean:
	rm -rf $(VENV) runs .pytest_cache
