# Two commands for a fresh machine: `make demo` (train COSMOS on real Fashion-MNIST) and `make test`.
# Each creates the virtual environment .venv and installs what it needs, the Debian data package included.

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
FMNIST  := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test venv data clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned to the release this project is tested with (CPU and CUDA alike)
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

data: $(FMNIST)

$(FMNIST):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist

demo: venv data
	$(VENV)/bin/cosmos-pl fit --config configs/fmnist_quickstart.yaml

test: venv data
	$(PY) -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
