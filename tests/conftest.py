import os

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]
