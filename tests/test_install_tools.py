"""tools/uv_index_args.py: pip's index settings, as ``pip config list`` prints them, become uv's flags."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "uv_index_args", Path(__file__).resolve().parents[1] / "tools" / "uv_index_args.py")
uv_index_args = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(uv_index_args)

LISTING = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/ignored/because/env/wins'
global.constraint='/etc/xdg/pip/constraints.txt'
user.index-url='https://mirror.example/simple'
"""


def test_env_wins_over_files_and_each_value_is_one_flag():
    settings = uv_index_args.pip_settings(LISTING)
    assert settings == {"find-links": "/opt/wheels", "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
                        "constraint": "/etc/xdg/pip/constraints.txt", "index-url": "https://mirror.example/simple"}
    assert uv_index_args.uv_args(settings) == [
        "--index-strategy", "unsafe-best-match", "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/opt/wheels", "--constraint", "/etc/xdg/pip/constraints.txt"]


def test_no_pip_configuration_leaves_uv_on_its_default_index():
    assert uv_index_args.uv_args(uv_index_args.pip_settings("")) == ["--index-strategy", "unsafe-best-match"]
    # options uv has no counterpart for here (cert, timeout) are not passed on
    assert uv_index_args.pip_settings("global.timeout='60'\n:env:.cert='/x'\n") == {}
