"""Whatever a node sends, the server's loop goes on: the reply validator (cosmos_pl/flower/validate.py) on random
malformed replies (missing keys, wrong types, negative and huge sizes, wrong shapes, NaN), through the server's own
join, upload and end-of-round paths (FlowerClients with a stand-in for the grid), never raises; a malformed reply
fails only its node's join or its client's step, with the reason recorded.
"""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rich.console import Console  # noqa: E402

from cosmos_pl.communication import CommunicationConfig  # noqa: E402
from cosmos_pl.execution.task_failure import TaskFailure  # noqa: E402
from cosmos_pl.runs.recorder import Recorder  # noqa: E402
from cosmos_pl.flower import validate  # noqa: E402
from cosmos_pl.flower.replies import SiteFailure, read_reply  # noqa: E402
from cosmos_pl.flower.server import FlowerClients  # noqa: E402

# random arrays include NaN and 1e30 cast to integer dtypes: numpy warns, and the server must cope
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

N, M, PUBLIC = 3, 4, 5
FINGERPRINT = "ab" * 8
BACKBONES = ["resnet8", "mlp", "resnet8"]


def honest_hello(cid: int) -> dict:
    return {"client_id": cid, "committed_round": -1, "digest": "0123456789abcdef", "public_fingerprint": FINGERPRINT,
            "backbone": BACKBONES[cid], "train_size": 40, "test_size": 10, "validation_size": 0, "parameters": 1000,
            "has_public": True, "identity": f"{cid:032x}", "data_mode": "partition"}


class _Grid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


class _Scripted(FlowerClients):
    """FlowerClients whose nodes answer with ``self.script[message type](node id)``: honest until a test says
    otherwise."""

    def send(self, message_type, contents, timeout=None):
        return {n: read_reply(self.script[message_type](n), self.n) for n in contents}


def _view():
    public = torch.zeros(PUBLIC, 1, 2, 2, dtype=torch.uint8)
    return SimpleNamespace(
        console=Console(quiet=True), recorder=Recorder(), reply_timeout_s=None, rounds=3, fingerprint=FINGERPRINT,
        runtime=SimpleNamespace(clients=SimpleNamespace(backbones=BACKBONES)), public=public,
        data=SimpleNamespace(classes=[str(c) for c in range(M)], num_classes=M),
        communication=CommunicationConfig(), reference=lambda i: {"w": torch.zeros(2, 3)},
        run_tasks=SimpleNamespace(timer=SimpleNamespace(add=lambda *a: None)), report_losses=lambda *a: None)


def _clients(script=None):
    """Three clients on nodes 100..102 that joined honestly."""
    base = {"query.hello": lambda n: RecordDict({"config": ConfigRecord(honest_hello(n - 100))}),
            "query.public": lambda n: RecordDict({"config": ConfigRecord({"stored": True})})}  # U in one chunk
    clients = _Scripted.__new__(_Scripted)
    clients.script = {**base, **(script or {})}
    FlowerClients.__init__(clients, _view(), grid=_Grid([100, 101, 102]), config_yaml="seed: 0", num_clients=N)
    return clients


# ----------------------------------------------------------------------------- strategies
_values = st.one_of(st.integers(min_value=-2**62, max_value=2**62), st.floats(allow_nan=True), st.booleans(),
                    st.text(max_size=30), st.just(""), st.binary(max_size=8),
                    st.lists(st.integers(min_value=-5, max_value=5), max_size=3))


@st.composite
def mutated(draw, honest: dict):
    """``honest`` with some keys dropped, some set to random values of any type, some to extreme numbers."""
    out = dict(honest)
    for key in draw(st.lists(st.sampled_from(sorted(honest)), max_size=4, unique=True)):
        action = draw(st.sampled_from(["drop", "random", "extreme"]))
        if action == "drop":
            del out[key]
        elif action == "random":
            out[key] = draw(_values)
        else:
            out[key] = draw(st.sampled_from([-1, -2**40, 2**62, 0, float("nan"), float("inf"), "../../x", True]))
    if draw(st.booleans()):
        out[draw(st.text(min_size=1, max_size=10))] = draw(_values)  # an extra key
    return out


def _record(values: dict) -> ConfigRecord:
    return ConfigRecord(values)


# ----------------------------------------------------------------------------- hello
def test_an_honest_hello_is_taken_and_each_wrong_field_is_named():
    expected = validate.HelloExpected(N, 3, FINGERPRINT, BACKBONES.__getitem__, "partition")
    got = validate.hello(RecordDict({"config": ConfigRecord(honest_hello(1))}), expected)
    assert (got.info.id, got.info.backbone, got.info.train_size, got.committed_round) == (1, "mlp", 40, -1)
    for key, value, words in [("client_id", 3, "outside 0..2"), ("client_id", True, "not an integer"),
                              ("train_size", 0, "outside 1..2147483647"), ("test_size", -1, "outside 0.."),
                              ("parameters", 10**12, "outside 0..100000000000"),
                              ("committed_round", 4, "outside -1..3"),
                              ("backbone", "vgg16", "the run config gives it 'mlp'"),
                              ("public_fingerprint", "cd" * 8, "the server's abab"),
                              ("digest", "../x", "not lowercase hex"),
                              ("data_mode", "site", "wants data_mode 'partition'"), ("has_public", 1, "not true/false"),
                              ("train_size", 1.5, "not an integer")]:
        with pytest.raises(validate.MalformedReply, match=re.escape(words)):
            validate.hello(RecordDict({"config": ConfigRecord({**honest_hello(1), key: value})}), expected)
    reply = honest_hello(1)
    del reply["train_size"]
    with pytest.raises(validate.MalformedReply, match="'train_size' is missing"):
        validate.hello(RecordDict({"config": ConfigRecord(reply)}), expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply=mutated(honest_hello(1)))
@example(reply={**honest_hello(1), "has_public": False})  # well-formed, without U: the server sends it U
def test_a_random_malformed_hello_never_stops_the_join(reply):
    clients = _clients()
    del clients.node_of[1]  # client 1's node left; node 103 now says it holds client 1
    clients.grid.nodes = [100, 102, 103]
    clients.script["query.hello"] = lambda n: RecordDict({"config": _record(reply)})
    clients.join(1, wait=False)
    expected = validate.HelloExpected(N, 3, FINGERPRINT, BACKBONES.__getitem__, "partition")
    try:
        ok = validate.hello(RecordDict({"config": _record(reply)}), expected)
    except validate.MalformedReply:
        ok = None
    if ok is not None and ok.info.id == 1 and ok.identity == f"{1:032x}":
        assert clients.node_of.get(1) == 103  # a well-formed hello of client 1 with its own token: it rejoins
        # its setup bytes: the run config ("seed: 0", 7 bytes) at each of its two greetings, and U (PUBLIC images of
        # 1x2x2 uint8, 4 bytes each) when its node says it has no U
        assert clients.extra_bytes["setup"][1] == 2 * 7 + (0 if ok.has_public else PUBLIC * 4)
    else:
        assert clients.node_of.get(1) is None and [f["node_id"] for f in clients.join_failures] == [103]
        assert clients.join_failures[0]["reason"]  # the refusal is recorded with its reason


@settings(max_examples=60, deadline=None)
@given(error=mutated({"type": "SiteDataError", "reason": "unknown class 'cat'", "client_id": 1,
                      "identity": f"{1:032x}", "stage": "local training"}))
def test_a_random_error_record_is_read_as_a_failure_and_a_site_failure_only_with_a_client_of_the_run(error):
    got = read_reply(RecordDict({"error": ConfigRecord(error)}), N)
    assert isinstance(got, TaskFailure) and isinstance(got.reason, str) and len(got.reason) <= validate.MAX_TEXT
    cid = error.get("client_id")
    is_site = error.get("type") == "SiteDataError" and type(cid) is int and 0 <= cid < N
    assert isinstance(got, SiteFailure) == is_site


def test_a_site_failure_claiming_a_client_is_refused_when_its_token_is_not_the_holders():
    clients = _clients()
    del clients.node_of[2]  # client 2's node left
    clients.grid.nodes = [100, 101, 103]
    clients.script["query.hello"] = lambda n: RecordDict({"error": ConfigRecord(
        {"type": "SiteDataError", "reason": "no data.npz", "client_id": 2, "identity": "f" * 32})})
    clients.join(1, wait=False)
    assert 2 not in clients.node_of and 2 not in clients.broken
    assert "client 2 was first held by another node" in clients.join_failures[0]["reason"]


# ----------------------------------------------------------------------------- uploads and scores
def _array_record(draw_arrays: dict) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in draw_arrays.items()})


_arrays = st.dictionaries(
    st.sampled_from(["values", "indices", "w", "x"]),
    st.builds(lambda shape, dtype, fill: np.full(shape, fill, dtype=dtype),
              st.lists(st.integers(min_value=0, max_value=7), min_size=0, max_size=3).map(tuple),
              st.sampled_from(["float32", "float64", "float16", "int64", "uint8"]),
              st.sampled_from([0.25, -1.0, float("nan"), 1e30])),
    max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays=_arrays, config=mutated({"num_classes": M, "dtype": "float32", "public_fingerprint": FINGERPRINT}),
       losses=st.dictionaries(st.text(max_size=8), st.floats(allow_nan=True), max_size=3),
       with_config=st.booleans())
def test_a_random_upload_fails_only_its_client(arrays, config, losses, with_config):
    honest = {"arrays": ArrayRecord({"values": Array(np.full((PUBLIC, M), 0.25, dtype="float32"))}),
              "config": ConfigRecord({"num_classes": M, "dtype": "float32", "public_fingerprint": FINGERPRINT}),
              "losses": MetricRecord({})}

    def reply(n):
        if n != 101:
            return RecordDict(honest)
        content = {"arrays": _array_record(arrays), "losses": MetricRecord(
            {k: v for k, v in losses.items() if not math.isnan(v)} if losses else {})}
        if with_config:
            content["config"] = _record(config)
        return RecordDict(content)

    clients = _clients({"query.pseudo_labels": reply})
    out = clients.upload(1, "soft", [0, 1, 2])
    assert not isinstance(out[0], TaskFailure) and not isinstance(out[2], TaskFailure)
    assert tuple(out[0].values.shape) == (PUBLIC, M)
    assert isinstance(out[1], TaskFailure) or tuple(out[1].values.shape) == (PUBLIC, M)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays=_arrays)
def test_random_weights_fail_only_their_client(arrays):
    honest = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros((2, 3), dtype="float32"))})})
    clients = _clients({"query.weights": lambda n: honest if n != 102 else RecordDict(
        {"arrays": _array_record(arrays)})})
    out = clients.upload(1, "weights", [0, 1, 2])
    assert torch.equal(out[0]["w"], torch.zeros(2, 3)) and torch.equal(out[1]["w"], torch.zeros(2, 3))
    assert isinstance(out[2], TaskFailure) or set(out[2]) == {"w"}


_score_keys = st.one_of(st.sampled_from(["test.client.top1", "test.teacher.top1", "validation.client.top5"]),
                        st.text(max_size=20))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metrics=st.dictionaries(_score_keys, st.one_of(st.floats(allow_nan=True), st.integers(-3, 3)), max_size=4),
       config=mutated({"digest": "0123456789abcdef"}))
def test_random_scores_fail_only_their_client(metrics, config):
    honest = RecordDict({"metrics": MetricRecord({"test.client.top1": 0.5}), "losses": MetricRecord({}),
                         "config": ConfigRecord({"digest": "0123456789abcdef"})})
    clients = _clients({"evaluate.scores": lambda n: honest if n != 100 else RecordDict(
        {"metrics": MetricRecord(metrics), "losses": MetricRecord({}), "config": _record(config)})})
    clients.begin_round(1)
    scores, failures = clients.end_round(1, {}, evaluate=True)
    assert scores[(1, "test")] == {"client": {"top1": 0.5}} and scores[(2, "test")] == {"client": {"top1": 0.5}}
    assert set(failures) <= {0}
    if 0 in failures:
        assert failures[0].reason.startswith("rejected: malformed reply")
        assert clients.reported.get(0) is None  # nothing of a rejected reply is kept
    else:
        assert all(0 <= v <= 1 or math.isnan(v) for (c, _), named in scores.items() if c == 0
                   for m in named.values() for v in m.values())


def test_a_score_above_one_or_an_unknown_model_is_rejected():
    for metrics in ({"test.client.top1": 1.5}, {"test.impostor.top1": 0.5}, {"train.client.top1": 0.5}):
        with pytest.raises(validate.MalformedReply):
            validate.scores(RecordDict({"metrics": MetricRecord(metrics),
                                        "config": ConfigRecord({"digest": "0123456789abcdef"})}), ())
    got = validate.scores(RecordDict({"metrics": MetricRecord({"test.teacher_prior.top1": 0.25,
                                                                "validation.client.top1": float("nan")}),
                                      "config": ConfigRecord({"digest": "0123456789abcdef"})}), ["teacher"])
    assert got[0]["test"] == {"teacher_prior": {"top1": 0.25}} and math.isnan(got[0]["validation"]["client"]["top1"])
