"""The Flower node and wire format without a Flower runtime: each handler called with a Context, as a node would.

What is checked by hand: byte counts of the arrays on the wire, the round trip of every client step and upload,
a node's refusal of a wrong partition, a public set or an unknown node config key, the roll-back of a failed client,
and a restarted node (a fresh Context, as after a crash) continuing from the model it committed on disk. What a node
checks of the server: a deployment's node without its own data, a missing or unreadable data folder, a run token or
fingerprint that would steer a path, a teacher whose tensors do not fit; its data cache keyed by the site's contents
(the folder digest worked out by hand); a hostile node's test faults (a corrupted upload, a malformed hello). The
server's join (FlowerClients) runs against these handlers with a stand-in for the grid: how long it waits, why
it stops, and the refusals it records; the ServerApp's one-line refusal of a bad setting.
"""

import functools
import json
import re
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402
from rich.console import Console  # noqa: E402

from cosmos_pl.objectives.distill import Distill  # noqa: E402
from cosmos_pl.objectives.joint import JointFit  # noqa: E402
from cosmos_pl.objectives.local_fit import LocalFit  # noqa: E402
from cosmos_pl.objectives.union import UnionFit  # noqa: E402
from cosmos_pl.parsers import build_fit_parser  # noqa: E402
from cosmos_pl.communication import decode, encode  # noqa: E402
from cosmos_pl.errors import ConfigError  # noqa: E402
from cosmos_pl.execution.task_failure import TaskFailure  # noqa: E402
from cosmos_pl.runs.recorder import Recorder  # noqa: E402
from cosmos_pl.runs.run_directory import RunDirectory  # noqa: E402
from cosmos_pl.flower import node, node_data, node_state, server_app, wire  # noqa: E402
from cosmos_pl.federated.runner import Runner, RunSettings, ServerData  # noqa: E402
from cosmos_pl.flower.replies import NodesMissing  # noqa: E402
from cosmos_pl.flower.server import FlowerClients  # noqa: E402
from cosmos_pl.objectives.wire import steps_from_wire, steps_to_wire  # noqa: E402
from cosmos_pl.uploads import UploadSpec, check_upload  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_flower.yaml"


@pytest.mark.parametrize("step", [LocalFit(3), Distill(2, lam=5.0, num_views=2, freeze_bn=True, prior_correction=True),
                                  JointFit(1, lam=0.5), UnionFit(4)])
def test_every_client_step_survives_the_wire(step):
    target = None if isinstance(step, LocalFit) else torch.eye(3)
    config, arrays = steps_to_wire([(step, target)])
    ConfigRecord(config)  # only values a ConfigRecord accepts
    (back, back_target), = steps_from_wire(config, arrays)
    assert back == step and (back_target is None if target is None else torch.equal(back_target, target))


def test_unknown_step_names_the_version_mismatch():
    with pytest.raises(ValueError, match="different cosmos-pl versions"):
        steps_from_wire({"steps": 1, "s0.step": "Teleport"}, {})


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


def _context(state_dir: Path, partition: int, state: RecordDict | None = None, key: str = "partition-id") -> Context:
    return Context(run_id=1, node_id=100 + partition, node_config={key: partition, "threads": 1},
                   state=state if state is not None else RecordDict(), run_config={"node-state-dir": str(state_dir)})


@pytest.fixture(scope="module")
def run_yaml():
    parser = build_fit_parser()
    cfg = parser.parse_args(["--config", str(CONFIG), "--clients.pretrain_epochs", "1"])
    return parser.dump(cfg, skip_unset=False)


def _hello(run_yaml, context, fingerprint=None, token="a0", mode="simulation", **extra):
    """The server's hello (as joining.py sends it) to ``context``'s node, answered by node.hello."""
    run = node_data.load_run(run_yaml, 0)
    return node.hello(RecordDict({"config": ConfigRecord({
        "config_yaml": run_yaml, "public_fingerprint": fingerprint or run.fingerprint, "run_token": token,
        "mode": mode, **extra})}), context)


def _msg(rnd, steps=(), **config):
    """A message of round ``rnd`` carrying training ``steps`` [(step, target or None)] ahead of its own request."""
    step_config, step_arrays = steps_to_wire(list(steps))
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


_KEYS_HINT = ("a node reads partition-id, data, state-dir, threads (flower-supernode --node-config \"partition-id=0 "
              "data='/srv/site_0' state-dir='/var/lib/cosmos-pl' threads=4\")")


def test_node_refuses_an_unknown_node_config_key_naming_the_close_match(run_yaml, tmp_path):
    with pytest.raises(ConfigError) as err:
        _hello(run_yaml, _context(tmp_path, 0, key="partiton-id"))
    assert str(err.value) == f"unknown node config key 'partiton-id' (did you mean 'partition-id'?): {_KEYS_HINT}"
    with pytest.raises(ConfigError) as err:
        node_state.check_node_config({"partition-id": 0, "sate-dir": "/x", "gpu": 1})
    assert str(err.value) == f"unknown node config keys 'gpu', 'sate-dir' (did you mean 'state-dir'?): {_KEYS_HINT}"
    # the keys Flower's simulation engine sets on every virtual node (strings) pass
    node_state.check_node_config({"partition-id": "3", "num-partitions": "6"})


def test_failed_round_rolls_back_and_a_restarted_node_continues_from_disk(run_yaml, tmp_path):
    ctx = _context(tmp_path, 1)
    info = _hello(run_yaml, ctx)["config"]
    assert info["client_id"] == 1 and info["committed_round"] == -1
    initial, fingerprint = info["digest"], info["public_fingerprint"]

    # round 0: local training rides on the scores message; the reply carries its loss
    reply = node.scores(_msg(0, [(LocalFit(1), None)], failed=False), ctx)
    round0 = reply["config"]["digest"]
    assert round0 != initial and set(reply["losses"]) == {"s0.loss"} and reply["losses"]["s0.loss"] > 0
    saved = torch.load(tmp_path / "a0" / "client_1.pt", weights_only=True)
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
    other = _hello(run_yaml, _context(tmp_path, 1), token="b0")["config"]
    assert other["committed_round"] == -1 and other["digest"] == initial


def test_a_step_before_hello_says_what_is_missing(tmp_path):
    with pytest.raises(RuntimeError, match="no query.hello received"):
        node.scores(_msg(1, [(LocalFit(1), None)], failed=False), _context(tmp_path, 0))


def test_co_training_targets_travel_as_one_byte_labels():
    target = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    config, arrays = steps_to_wire([(UnionFit(1), target)])
    assert arrays["s0.labels"].dtype == torch.uint8 and arrays["s0.labels"].tolist() == [1, 0]  # 2 bytes, as FedCT counts
    assert torch.equal(steps_from_wire(config, arrays)[0][1], target)


def test_steps_and_targets_travel_in_order():
    target = torch.rand(4, 3)
    config, arrays = steps_to_wire([(LocalFit(2), None), (Distill(1, lam=5.0), target)])
    assert config["steps"] == 2 and set(arrays) == {"s1.target"}
    back = steps_from_wire(config, arrays)
    assert back[0] == (LocalFit(2), None) and back[1][0] == Distill(1, lam=5.0) and torch.equal(back[1][1], target)


class _Grid:
    """What FlowerClients' join asks of Flower's Grid: the connected node ids."""

    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return list(self.nodes)


class _HelloClients(FlowerClients):
    """FlowerClients whose hello messages are answered by node.hello on the test's contexts ({node id: Context}), an
    exception becoming the error reply the ClientApp sends (``"<type>: <message>"``)."""

    def send(self, message_type, contents, timeout=None):
        assert message_type == wire.HELLO
        out = {}
        for node_id, content in contents.items():
            try:
                out[node_id] = node.hello(content, self.grid.nodes[node_id])
            except Exception as err:
                out[node_id] = TaskFailure(f"{type(err).__name__}: {err}")
        return out


def _runner(run_yaml, tmp_path, contexts, join_timeout_s):
    """A Runner whose clients are the nodes of ``contexts``: it joins them as it is built."""
    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_string(run_yaml))
    _, federation = init.data.build(init.seed)
    transport = functools.partial(_HelloClients, grid=_Grid(contexts), config_yaml=run_yaml, num_clients=6,
                                  join_timeout_s=join_timeout_s)
    return Runner(ServerData(federation.public, federation.classes), init.algorithm, init.clients,
                  RunSettings(rounds=init.rounds, seed=init.seed, trainer=init.trainer, executor=init.executor),
                  console=Console(quiet=True), recorder=Recorder(RunDirectory.prepare(tmp_path / "run")),
                  transport=transport)


# far above the nodes' answers (6 hellos, each building a client's data and round-0 model: 86 s on a loaded 2-core
# machine), so that only a server that did not stop early reaches it
JOIN_TIMEOUT_S = 600


def test_join_stops_early_once_every_node_answered_and_records_the_refusal(run_yaml, tmp_path):
    # 6 clients; 6 nodes connected: 0..4 as configured, the sixth with a misspelt partition-id
    contexts = {100 + i: _context(tmp_path / "nodes", i) for i in range(5)}
    contexts[105] = _context(tmp_path / "nodes", 5, key="partiton-id")
    start = time.monotonic()
    with pytest.raises(NodesMissing) as err:
        _runner(run_yaml, tmp_path, contexts, join_timeout_s=JOIN_TIMEOUT_S)
    took = time.monotonic() - start
    assert took < JOIN_TIMEOUT_S  # not the whole join timeout: every node had answered
    reason = f"ConfigError: unknown node config key 'partiton-id' (did you mean 'partition-id'?): {_KEYS_HINT}"
    message = re.sub(r"within \d+\.\d s", "within T s", str(err.value))
    assert message == ("only 5 of 6 clients joined (missing: [5]): all 6 connected nodes answered within T s and 1 "
                       f"refused, so the server stopped waiting before join-timeout={JOIN_TIMEOUT_S} s; node 105 could not "
                       f"join: {reason}")
    waited = float(re.search(r"within (\d+\.\d) s", str(err.value)).group(1))
    assert 0 <= waited <= took + 0.05  # the real wait, printed to 0.1 s

    nodes = json.loads((tmp_path / "run" / "nodes.json").read_text())
    assert nodes["clients"] == {str(i): 100 + i for i in range(5)}
    assert nodes["join_failures"] == [{"round": 0, "node_id": 105, "reason": reason}]


def test_join_waits_the_whole_timeout_for_a_missing_node_and_says_so(run_yaml, tmp_path):
    contexts = {100 + i: _context(tmp_path / "nodes", i) for i in range(5)}  # client 5 has no node
    start = time.monotonic()
    with pytest.raises(NodesMissing) as err:
        _runner(run_yaml, tmp_path, contexts, join_timeout_s=1.5)
    took = time.monotonic() - start
    waited = float(re.search(r"\((\d+\.\d) s\)", str(err.value)).group(1))
    assert 1.5 <= waited <= took + 0.05  # the real wait (printed to 0.1 s), at least the timeout
    assert str(err.value) == (f"only 5 of 6 clients joined (missing: [5]): waited the whole join-timeout=1.5 s "
                              f"({waited:.1f} s) with 5 nodes connected; start one SuperNode per client with "
                              "--node-config 'partition-id=<client>' against this SuperLink")


@pytest.mark.parametrize("run_config, error", [
    ({"config": str(CONFIG), "args": "--bogus 1", "simulation": True},
     "unrecognized arguments: --bogus 1 (run config 'config' and 'args' are cosmos-pl fit's; options: cosmos-pl fit "
     "--help)"),
    ({"args": "--seed 1"}, "run config 'config' is empty: give a YAML config, e.g. flwr run . --run-config "
                           "\"config='configs/digits_flower.yaml'\""),
])
def test_server_app_refuses_a_bad_setting_with_one_line(run_config, error, capsys):
    with pytest.raises(ConfigError) as err:
        server_app.main(None, run_config)
    assert str(err.value) == error
    assert capsys.readouterr().out == f"cosmos-pl: error: {error}\n"


def test_a_nodes_later_messages_load_its_data_from_its_disk_cache(run_yaml, tmp_path, monkeypatch):
    """Flower starts a process per message: only the first builds the federation; the others read the client's
    data and U from state-dir/data, the same tensors, and never load the data set."""
    from cosmos_pl.config import DataConfig

    ctx = _context(tmp_path, 2)
    first = _hello(run_yaml, ctx)
    cached = list((tmp_path / "data").rglob("client_2.pt"))
    assert len(cached) == 1
    built = node_data.load_run(run_yaml, 2, tmp_path / "data")
    node_data.clear_runs()  # a new message process: nothing in memory

    def no_loading(self, seed):
        raise AssertionError("the data set was loaded again")

    monkeypatch.setattr(DataConfig, "build", no_loading)
    again = node_data.load_run(run_yaml, 2, tmp_path / "data")
    for field in ("x", "y", "x_test", "y_test"):
        assert torch.equal(getattr(again.data, field), getattr(built.data, field))
    assert torch.equal(again.public, built.public) and again.fingerprint == built.fingerprint
    assert (again.num_clients, again.num_classes, again.in_chans, again.image_shape) == (6, 10, 1, (8, 8))
    assert int(first["config"]["client_id"]) == 2


def test_client_app_replies_a_failing_step_as_an_error_record_with_its_stage(monkeypatch):
    """The ClientApp turns a handler's exception into ``{"error": {...}}`` (one line, the type first) and a carried
    step's :class:`node.StepFailed` keeps the stage's name, so the server records the right stage for the client."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from cosmos_pl.flower import client_app

    for name in ("_run_id", "_task_id", "_node_id"):  # a Message is only built inside a Flower task
        monkeypatch.setattr(TaskIdentity, name, 1)
    message = Message(RecordDict({"run": ConfigRecord({"round": 0})}), dst_node_id=3, message_type="query.hello")

    def broken(content, context):
        raise ValueError("no such\n   file")

    def failed_step(content, context):
        raise node.StepFailed("client distillation", RuntimeError("loss is nan"))

    assert dict(client_app._reply(message, None, broken).content["error"]) == {
        "type": "ValueError", "reason": "ValueError: no such file"}
    assert dict(client_app._reply(message, None, failed_step).content["error"]) == {
        "type": "StepFailed", "reason": "RuntimeError: loss is nan", "stage": "client distillation"}
    ok = client_app._reply(message, None, lambda content, context: RecordDict({"ok": ConfigRecord({"v": 2})}))
    assert dict(ok.content["ok"]) == {"v": 2} and "error" not in ok.content


def test_a_node_restarted_under_its_old_id_is_read_as_a_node_that_left(tmp_path):
    # under SuperNode authentication a restarted node keeps its node id; its first message finds no query.hello
    from cosmos_pl.flower.client_app import HANDLERS, respond
    from cosmos_pl.flower.replies import NodeRestarted, read_reply

    content = RecordDict({"config": ConfigRecord({"round": 2, "public_fingerprint": "f" * 16})})
    reply = read_reply(respond(HANDLERS["query.pseudo_labels"], content, _context(tmp_path, 2)))
    assert isinstance(reply, NodeRestarted) and reply.step is None
    assert reply.reason.startswith("NotSetUp: this node has not been set up for the run (no query.hello received")


# --------------------------------------------------------------------------- what a node checks of the server
@pytest.fixture(scope="module")
def site_root(run_yaml, tmp_path_factory):
    """The federation of ``run_yaml`` exported as site folders (client_<i>/data.npz, public.npz), the hello's site
    fields (classes, public_shape) and U's fingerprint."""
    from cosmos_pl.data.sites import export_federation
    from cosmos_pl.uploads import public_fingerprint

    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_string(run_yaml))
    _, fed = init.data.build(init.seed)
    root = tmp_path_factory.mktemp("sites")
    export_federation(fed, root)
    return root, {"classes": list(fed.classes), "public_shape": [int(v) for v in fed.public.shape]}, \
        public_fingerprint(fed.public)


def _site_context(state_dir: Path, partition: int, folder) -> Context:
    return Context(run_id=1, node_id=100 + partition, node_config={"partition-id": partition, "data": str(folder),
                                                                   "threads": 1},
                   state=RecordDict(), run_config={"node-state-dir": str(state_dir)})


_NO_DATA = ("node config has no data=<folder>: in a deployment each site serves its own data (flower-supernode "
            "--node-config \"partition-id=0 data='/srv/site_0'\"); this node would build the whole federation from "
            "the data set the run config names, so it refuses to join")


def test_a_deployment_node_without_its_own_data_refuses_to_join(run_yaml, tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the node built the federation")

    monkeypatch.setattr(node, "load_run", no_loading)  # refused before any data are read
    with pytest.raises(ConfigError) as err:
        node.hello(RecordDict({"config": ConfigRecord({"config_yaml": run_yaml, "public_fingerprint": "ab" * 8,
                                                       "run_token": "a0", "mode": "deployment"})}),
                   _context(tmp_path, 0))
    assert str(err.value) == _NO_DATA
    with pytest.raises(ConfigError, match=r"the server sent mode='swarm': expected one of deployment, simulation"):
        node.hello(RecordDict({"config": ConfigRecord({"config_yaml": run_yaml, "public_fingerprint": "ab" * 8,
                                                       "run_token": "a0", "mode": "swarm"})}), _context(tmp_path, 0))


def test_the_hello_reply_says_where_the_nodes_data_come_from(run_yaml, site_root, tmp_path):
    root, site_config, fingerprint = site_root
    partition = _hello(run_yaml, _context(tmp_path / "p", 0))["config"]
    assert partition["data_mode"] == "partition" and partition["has_public"] is True
    site = _hello(run_yaml, _site_context(tmp_path / "s", 0, root / "client_0"), mode="deployment",
                  fingerprint=fingerprint, **site_config)["config"]
    # its own folder, and no U yet (the server sends it after the hello)
    assert site["data_mode"] == "site" and site["has_public"] is False and site["client_id"] == 0
    assert site["public_fingerprint"] == fingerprint


def test_a_data_folder_that_is_not_there_or_not_readable_refuses_the_join(run_yaml, site_root, tmp_path, monkeypatch):
    _, site_config, fingerprint = site_root

    def no_loading(*args, **kwargs):
        raise AssertionError("load_run was reached: a refused join reads no data")

    monkeypatch.setattr(node, "load_run", no_loading)
    hello = functools.partial(_hello, run_yaml, mode="deployment", fingerprint=fingerprint, **site_config)
    missing = tmp_path / "site_9"
    with pytest.raises(ConfigError) as err:
        hello(_site_context(tmp_path, 0, missing))
    assert str(err.value) == (f"node config data='{missing}': no such folder (give the folder cosmos-pl "
                              "export-partition wrote for this site)")
    a_file = tmp_path / "data.npz"
    a_file.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"node config data='.*data\.npz': is not a folder"):
        hello(_site_context(tmp_path, 0, a_file))
    folder = tmp_path / "site_0"
    folder.mkdir()
    monkeypatch.setattr(node_state.os, "access", lambda path, mode: False)  # (the tests may run as root)
    with pytest.raises(ConfigError) as err:
        hello(_site_context(tmp_path, 0, folder))
    assert str(err.value).startswith(f"node config data='{folder}': is not readable by this node's user (")


def test_a_run_token_or_fingerprint_that_is_not_hex_is_refused_before_it_becomes_a_path(run_yaml, tmp_path):
    from cosmos_pl.flower.client_app import HANDLERS, respond

    with pytest.raises(ValueError) as err:
        _hello(run_yaml, _context(tmp_path, 0), token="../../etc")
    assert str(err.value) == ("the server sent run_token='../../etc': not a hex string of at most 64 digits; refusing "
                              "it (it would become part of a path on this node)")
    content = RecordDict({"config": ConfigRecord({"config_yaml": run_yaml, "public_fingerprint": "ab", "mode":
                                                  "simulation", "run_token": "A0"})})  # upper case: not ours
    reply = respond(HANDLERS["query.hello"], content, _context(tmp_path, 0))  # a refused join: an error reply
    assert dict(reply["error"]) == {"type": "ValueError", "reason": "ValueError: the server sent run_token='A0': not a "
                                    "hex string of at most 64 digits; refusing it (it would become part of a path "
                                    "on this node)"}
    assert node_state.checked_hex("t", "0123456789abcdef" * 4) == "0123456789abcdef" * 4  # 64 digits pass
    with pytest.raises(ValueError, match="not a hex string of at most 64 digits"):
        node_state.checked_hex("t", "a" * 65)
    with pytest.raises(ValueError, match=r"public_fingerprint='x/y': not a hex string"):
        node.public(RecordDict({"config": ConfigRecord({"public_fingerprint": "x/y", "start": 0, "rows": 2}),
                                "arrays": wire.tensors_to_record({"x": torch.zeros(2, 1, 8, 8, dtype=torch.uint8)})}),
                    _context(tmp_path, 0))
    with pytest.raises(ValueError, match=r"public_fingerprint='\.\./u': not a hex string"):
        node_data.Site("/srv/site_0", ("a",), (1, 1, 8, 8), "../u", tmp_path / "public")
    assert not (tmp_path / "public").exists() and not list(tmp_path.parent.glob("etc"))  # nothing written


def _digest_by_hand(files: dict[str, bytes]) -> str:
    import hashlib

    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{hashlib.sha256(files[rel]).hexdigest()}\n".encode())
    return h.hexdigest()


def test_folder_digest_is_sha256_over_relative_paths_and_file_hashes(tmp_path):
    import hashlib

    folder = tmp_path / "site"
    files = {"train/7/img_1.png": b"\x89PNG one", "train/3/img_0.png": b"\x89PNG zero", "data.npz": b"PK\x03\x04"}
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    # by hand: data.npz, train/3/img_0.png, train/7/img_1.png in that order
    npz, zero, one = (hashlib.sha256(b).hexdigest() for b in (b"PK\x03\x04", b"\x89PNG zero", b"\x89PNG one"))
    h = hashlib.sha256()
    h.update(f"data.npz\0{npz}\n".encode())
    h.update(f"train/3/img_0.png\0{zero}\n".encode())
    h.update(f"train/7/img_1.png\0{one}\n".encode())
    assert node_data.folder_digest(folder) == h.hexdigest() == _digest_by_hand(files)


def test_folder_digest_reads_a_file_again_only_when_its_size_or_mtime_changed(tmp_path):
    import hashlib
    import os

    folder, index = tmp_path / "site", tmp_path / "cache" / "file_digests.json"
    folder.mkdir()
    path = folder / "data.npz"
    path.write_bytes(b"abcd")
    old = time.time_ns() - 60 * 10**9  # a minute ago: not "racy"
    os.utime(path, ns=(old, old))
    assert node_data.folder_digest(folder, index) == _digest_by_hand({"data.npz": b"abcd"})
    entry = [4, old, hashlib.sha256(b"abcd").hexdigest()]
    assert json.loads(index.read_text()) == {str(path): entry}
    # an unchanged size and mtime: the index is believed (here a made-up digest, to show the file is not read)
    index.write_text(json.dumps({str(path): [4, old, "0" * 64]}))
    made_up = hashlib.sha256(f"data.npz\0{'0' * 64}\n".encode()).hexdigest()
    assert node_data.folder_digest(folder, index) == made_up
    # the same size, another mtime: read again
    path.write_bytes(b"abce")
    os.utime(path, ns=(old + 10**9, old + 10**9))  # a second later (any file system's timestamps tell them apart)
    assert node_data.folder_digest(folder, index) == _digest_by_hand({"data.npz": b"abce"})
    assert json.loads(index.read_text()) == {str(path): [4, old + 10**9, hashlib.sha256(b"abce").hexdigest()]}
    # a file changed a moment ago is read every time, not indexed (its next change may keep its mtime)
    path.write_bytes(b"abcf")
    assert node_data.folder_digest(folder, index) == _digest_by_hand({"data.npz": b"abcf"})
    assert json.loads(index.read_text()) == {}


def test_the_data_cache_key_follows_the_sites_contents_and_the_servers_class_list(tmp_path):
    folder = tmp_path / "site"
    (folder / "train" / "cat").mkdir(parents=True)
    image = folder / "train" / "cat" / "0.png"
    image.write_bytes(b"1234")
    cache = tmp_path / "data"

    def key(classes=("cat", "dog"), shape=(269, 1, 8, 8)):
        return node_data.data_key("seed: 0\n", node_data.Site(str(folder), classes, shape, "ab", tmp_path), cache)

    first = key()
    assert key() == first  # nothing changed
    image.write_bytes(b"1235")  # the same size, other contents
    changed = key()
    assert changed != first
    image.write_bytes(b"1234")  # back as it was: the same data, the same key
    assert key() == first
    assert key(classes=("dog", "cat")) != first and key(classes=("cat", "dog", "emu")) != first
    assert key(shape=(269, 3, 8, 8)) != first
    # partition-id mode: the config text alone, as before
    import hashlib

    assert node_data.data_key("seed: 0\n") == hashlib.sha256(b"seed: 0\n").hexdigest()[:16]


def test_a_site_whose_data_changed_gets_a_fresh_build(run_yaml, site_root, tmp_path):
    import shutil

    import numpy as np

    root, site_config, fingerprint = site_root
    folder = tmp_path / "client_0"
    shutil.copytree(root / "client_0", folder)
    hello = functools.partial(_hello, run_yaml, mode="deployment", fingerprint=fingerprint, **site_config)
    before = hello(_site_context(tmp_path / "node", 0, folder))["config"]
    with np.load(folder / "data.npz") as z:
        arrays = dict(z)
    n = len(arrays["y_train"])
    np.savez(folder / "data.npz", **{**arrays, "x_train": arrays["x_train"][: n - 10],
                                     "y_train": arrays["y_train"][: n - 10]})
    node_data.clear_runs()  # a new message's process
    after = hello(_site_context(tmp_path / "node", 0, folder))["config"]
    # 10 fewer training samples, less the validation split carved from them
    assert after["train_size"] < before["train_size"]
    assert len(list((tmp_path / "node" / "data").glob("*/client_0.pt"))) == 2  # two builds, two keys


def _teacher_content(backbone, state):
    return RecordDict({"config": ConfigRecord({"eval": "teacher", "eval.teacher.backbone": backbone}),
                       "eval.teacher": wire.tensors_to_record(state)})


def test_a_teacher_is_loaded_only_with_exactly_the_models_float_tensors(run_yaml):
    from cosmos_pl.models import create_backbone

    run = node_data.load_run(run_yaml, 0)
    backbone = run.backbone(0)
    torch.manual_seed(7)
    teacher = create_backbone(backbone, run.num_classes, run.in_chans, max(run.image_shape))
    floats = {k: v.detach().clone() + 0.5 for k, v in teacher.state_dict().items() if v.is_floating_point()}
    others = sorted(k for k, v in teacher.state_dict().items() if not v.is_floating_point())
    assert others and all(k.endswith("num_batches_tracked") for k in others)  # BatchNorm's, not sent

    loaded = node.sent_models(_teacher_content(backbone, floats), run)["teacher"].state_dict()
    assert all(torch.equal(loaded[k], floats[k]) for k in floats)

    name = sorted(floats)[0]
    missing = {k: v for k, v in floats.items() if k != name}
    with pytest.raises(ValueError) as err:
        node.sent_models(_teacher_content(backbone, missing), run)
    assert str(err.value) == (f"eval.teacher: the server sent tensors that do not fit its architecture {backbone} for "
                              f"this run: 1 missing ({name}); not scoring it (a server of another cosmos-pl version?)")
    with pytest.raises(ValueError, match=r"eval\.teacher: .*: 1 unexpected \(extra\.weight\); not scoring"):
        node.sent_models(_teacher_content(backbone, {**floats, "extra.weight": torch.zeros(3)}), run)
    shape = tuple(floats[name].shape)
    wrong = {**floats, name: torch.zeros(shape[0] + 1, *shape[1:])}
    with pytest.raises(ValueError) as err:
        node.sent_models(_teacher_content(backbone, wrong), run)
    assert str(err.value).endswith(f"1 of another shape ({name} {(shape[0] + 1, *shape[1:])} (the model's {shape})); "
                                   "not scoring it (a server of another cosmos-pl version?)")


# --------------------------------------------------------------------------- a hostile node (test faults)
@pytest.mark.parametrize("kind", ["negative", "shape", "fingerprint"])
def test_a_node_with_an_upload_fault_sends_corrupted_pseudo_labels(run_yaml, tmp_path, monkeypatch, kind,
                                                                   injected_faults):
    faults = injected_faults
    ctx = _context(tmp_path, 2)
    fingerprint = _hello(run_yaml, ctx)["config"]["public_fingerprint"]
    reply = node.pseudo_labels(_upload(1, fingerprint), ctx)
    clean = wire.record_to_payload(reply["arrays"], reply["config"])
    monkeypatch.setenv(faults.ENV, json.dumps([{"round": 1, "client": 2, "step": "upload", "kind": kind}]))
    reply = node.pseudo_labels(_upload(1, fingerprint), ctx)
    sent = wire.record_to_payload(reply["arrays"], reply["config"])
    expected = faults.corrupt(clean, kind)
    assert torch.equal(sent.values, expected.values) and sent.public_fingerprint == expected.public_fingerprint
    if kind == "negative":  # row 0, class 0 set to -0.5; every other value as the clean upload's
        assert sent.values[0, 0].item() == -0.5 and torch.equal(sent.values[1:], clean.values[1:])
    elif kind == "shape":  # the first of U's 269 rows left out
        assert tuple(sent.values.shape) == (268, 10) and torch.equal(sent.values, clean.values[1:])
    else:
        assert sent.public_fingerprint == "0" * 16 != fingerprint and torch.equal(sent.values, clean.values)
    other_round = node.pseudo_labels(_upload(2, fingerprint), ctx)  # planned for round 1 only
    assert torch.equal(wire.record_to_payload(other_round["arrays"], other_round["config"]).values, clean.values)


def test_a_node_with_a_hello_fault_replies_a_malformed_hello_and_does_no_work(run_yaml, tmp_path, monkeypatch,
                                                                             injected_faults):
    faults = injected_faults
    monkeypatch.setenv(faults.ENV, json.dumps([{"client": 3, "step": "hello", "kind": "malformed"}]))  # no round
    assert faults.load() == [faults.Fault(-1, 3, "hello", "malformed")]
    reply = _hello(run_yaml, _context(tmp_path / "n3", 3))
    cfg = dict(reply["config"])
    assert set(cfg) == {"client_id", "train_size", "parameters", "backbone"}  # no digest, no data_mode
    assert cfg["client_id"] == "one" and cfg["train_size"] == -5 and cfg["backbone"] == 7
    assert cfg["parameters"] != cfg["parameters"]  # NaN
    assert not (tmp_path / "n3").exists()  # no data, no identity: it did nothing
    assert _hello(run_yaml, _context(tmp_path / "n2", 2))["config"]["client_id"] == 2  # another client: as usual

    from cosmos_pl.flower.validate import HelloExpected, MalformedReply, hello as check_hello

    expected = HelloExpected(6, 2, "ab" * 8, lambda cid: "test_efficientnet", "partition")
    with pytest.raises(MalformedReply, match="client_id"):
        check_hello(reply, expected)
    monkeypatch.setenv(faults.ENV, json.dumps([{"client": 3, "step": "hello", "kind": "mangled"}]))
    with pytest.raises(ValueError, match="unknown fault kind 'mangled'"):
        faults.load()


def test_a_nodes_failure_is_also_printed_for_the_sites_own_log(capsys):
    from cosmos_pl.flower.client_app import respond

    def hello(content, context):
        raise ValueError("node config data='/srv/x': no such folder")

    reply = respond(hello, RecordDict(), None)
    assert reply["error"]["reason"] == "ValueError: node config data='/srv/x': no such folder"
    assert capsys.readouterr().err == "cosmos-pl node: hello: ValueError: node config data='/srv/x': no such folder\n"
