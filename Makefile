# Two commands for a fresh machine: `make demo` (train COSMOS on real Fashion-MNIST) and `make test`.
# Each creates the virtual environment .venv and installs what it needs, the Debian data package included.

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
FMNIST  := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test venv data clean

venv: $(VENV)/.installed

# The demo needs the package only; the tests add the `test` and `flower` extras on top. torch is pinned to the
# release this project is tested with (CPU and CUDA alike). One pip call per target (one resolve), no bytecode from
# pip, then bytecode on every core (pip compiles on one; as with pip, the few files that do not compile, templates
# and test data inside packages, are skipped).
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile
COMPILE     := $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.14.1 torchvision==0.29.1 -e .
	$(COMPILE)
	touch $@

# the tests cover the Flower transport too: the `flower` extra (flwr with its simulation engine) comes with them;
# on a fresh machine both targets' packages come in one pip call
$(VENV)/.installed-test: pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.14.1 torchvision==0.29.1 -e '.[test,flower]'
	$(COMPILE)
	touch $(VENV)/.installed $@

data: $(FMNIST)

# apt-get update only when the package lists do not know the package yet (it takes a while)
$(FMNIST):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist || \
	  { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; }

demo: venv data
	$(VENV)/bin/cosmos-pl fit --config configs/fmnist_quickstart.yaml

test: $(VENV)/.installed-test data
	$(PY) -m pytest -n auto

clean:
	rm -rf $(VENV) runs .pytest_cache
