"""The Flower node and wire format without a Flower runtime: each handler called with a Context, as a node would.

What is checked by hand: byte counts of the arrays on the wire, the round trip of every client step and upload,
a node's refusal of a wrong partition or public set, the roll-back of a failed client, and a restarted node (a
fresh Context, as after a crash) continuing from the model it committed on disk.
"""

from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from cosmos_pl.algorithms.base import Distill, JointFit, LocalFit, UnionFit  # noqa: E402
from cosmos_pl.communication import decode, encode  # noqa: E402
from cosmos_pl.flower import node, wire  # noqa: E402
from cosmos_pl.uploads import UploadSpec, check_upload  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_flower.yaml"


@pytest.mark.parametrize("step", [LocalFit(3), Distill(2, lam=5.0, num_views=2, freeze_bn=True, prior_correction=True),
                                  JointFit(1, lam=0.5), UnionFit(4)])
def test_every_client_step_survives_the_wire(step):
    config = wire.step_to_config(step)
    ConfigRecord(config)  # only values a ConfigRecord accepts
    assert wire.config_to_step(config) == step


def test_unknown_step_names_the_version_mismatch():
    with pytest.raises(ValueError, match="different cosmos-pl versions"):
        wire.config_to_step({"step": "Teleport"})


def test_top_k_upload_round_trip_and_its_bytes():
    probs = torch.softmax(torch.randn(269, 10, generator=torch.Generator().manual_seed(0)), dim=1)
    payload = encode(probs, "float16", 3, "abcd")
    arrays, meta = wire.payload_to_record(payload)
    back = wire.record_to_payload(arrays, meta)
    # 269 rows x 3 kept values x (2 bytes float16 + 1 byte uint8 class index) = 2421 bytes
    assert wire.array_bytes(arrays)[0] == 269 * 3 * 3 == payload.nbytes == 2421
    assert wire.array_bytes(arrays)[1] > 2421  # numpy's header per array comes on top
    assert torch.equal(back.values, payload.values) and torch.equal(back.indices, payload.indices)
    assert back.public_fingerprint == "abcd" and back.dtype == "float16" and back.num_classes == 10
    check_upload(back, UploadSpec(269, 10, "float16", 3, "abcd"))
    assert torch.equal(decode(back), decode(payload))


def _context(state_dir: Path, partition: int, state: RecordDict | None = None) -> Context:
    return Context(run_id=1, node_id=100 + partition, node_config={"partition-id": partition, "threads": 1},
                   state=state if state is not None else RecordDict(), run_config={"node-state-dir": str(state_dir)})


@pytest.fixture(scope="module")
def run_yaml():
    from cosmos_pl.cli import build_fit_parser

    parser = build_fit_parser()
    cfg = parser.parse_args(["--config", str(CONFIG), "--clients.pretrain_epochs", "1"])
    return parser.dump(cfg, skip_unset=False)


def _hello(run_yaml, context, fingerprint=None, token="run-a"):
    run = node.load_run(run_yaml)
    return node.hello(RecordDict({"config": ConfigRecord({
        "config_yaml": run_yaml, "public_fingerprint": fingerprint or run.fingerprint, "run_token": token})}), context)


def _msg(rnd, steps=(), **config):
    """A message of round ``rnd`` carrying training ``steps`` [(step, target or None)] ahead of its own request."""
    step_config, step_arrays = wire.steps_to_record(list(steps))
    content = RecordDict({"config": ConfigRecord({"round": rnd, **config, **step_config})})
    if step_arrays:
        content["arrays"] = wire.tensors_to_record(step_arrays)
    return content


def _upload(rnd, fingerprint, steps=()):
    return _msg(rnd, steps, kind="soft", dtype="float16", top_k=0, public_fingerprint=fingerprint)


def test_node_refuses_a_partition_out_of_range_or_another_public_set(run_yaml, tmp_path):
    with pytest.raises(ValueError, match=r"partition-id=6: give each node its own client, 0\.\.5"):
        _hello(run_yaml, _context(tmp_path, 6))
    with pytest.raises(ValueError, match="public set U differs"):
        _hello(run_yaml, _context(tmp_path, 0), fingerprint="0" * 16)
    ctx = _context(tmp_path, 2)
    _hello(run_yaml, ctx)
    with pytest.raises(ValueError, match="not answering"):
        node.pseudo_labels(_upload(1, "f" * 16), ctx)


def test_failed_round_rolls_back_and_a_restarted_node_continues_from_disk(run_yaml, tmp_path):
    ctx = _context(tmp_path, 1)
    info = _hello(run_yaml, ctx)["config"]
    assert info["client_id"] == 1 and info["committed_round"] == -1
    initial, fingerprint = info["digest"], info["public_fingerprint"]

    # round 0: local training rides on the scores message; the reply carries its loss
    reply = node.scores(_msg(0, [(LocalFit(1), None)], failed=False), ctx)
    round0 = reply["config"]["digest"]
    assert round0 != initial and set(reply["losses"]) == {"s0.loss"} and reply["losses"]["s0.loss"] > 0
    saved = torch.load(tmp_path / "run-a" / "client_1.pt", weights_only=True)
    assert saved["round"] == 0 and saved["digest"] == round0

    # round 1: it trains before uploading, then the server says it failed the round: back to its round-0 model
    node.pseudo_labels(_upload(1, fingerprint, [(LocalFit(1), None)]), ctx)
    assert node.scores(_msg(1, failed=True), ctx)["config"]["digest"] == round0

    # round 2: a distillation target with a NaN fails the step on the node: it rolls back and says which step failed
    target = torch.full((269, 10), 0.1)
    target[5, 3] = float("nan")
    reply = node.scores(_msg(2, [(Distill(1), target)], failed=False), ctx)["config"]
    assert reply["digest"] == round0 and reply["failed_step"] == "client distillation"
    assert "non-finite (nan) in 1 of 269 rows" in reply["failure"]

    # round 3 starts, the node trains, then it is killed: a new process has an empty node state
    node.pseudo_labels(_upload(3, fingerprint, [(LocalFit(1), None)]), ctx)
    restarted = _context(tmp_path, 1)
    again = _hello(run_yaml, restarted)["config"]
    assert again["committed_round"] == 2 and again["digest"] == round0  # its last committed model, intact
    up = node.pseudo_labels(_upload(4, fingerprint), restarted)
    # |U| = 269 public samples x M = 10 classes x 2 bytes (float16)
    assert wire.array_bytes(up["arrays"])[0] == 269 * 10 * 2

    # another run (a new token) on the same node and disk starts from the round-0 model, not this run's
    other = _hello(run_yaml, _context(tmp_path, 1), token="run-b")["config"]
    assert other["committed_round"] == -1 and other["digest"] == initial


def test_a_step_before_hello_says_what_is_missing(tmp_path):
    with pytest.raises(RuntimeError, match="no query.hello received"):
        node.scores(_msg(1, [(LocalFit(1), None)], failed=False), _context(tmp_path, 0))


def test_co_training_targets_travel_as_one_byte_labels():
    target = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    config, arrays = wire.steps_to_record([(UnionFit(1), target)])
    assert arrays["s0.labels"].dtype == torch.uint8 and arrays["s0.labels"].tolist() == [1, 0]  # 2 bytes, as FedCT counts
    assert torch.equal(wire.record_to_steps(config, arrays)[0][1], target)


def test_steps_and_targets_travel_in_order():
    target = torch.rand(4, 3)
    config, arrays = wire.steps_to_record([(LocalFit(2), None), (Distill(1, lam=5.0), target)])
    assert config["steps"] == 2 and set(arrays) == {"s1.target"}
    back = wire.record_to_steps(config, arrays)
    assert back[0] == (LocalFit(2), None) and back[1][0] == Distill(1, lam=5.0) and torch.equal(back[1][1], target)
