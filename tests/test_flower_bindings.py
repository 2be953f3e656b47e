"""Client ids bound to SuperNode keys (cosmos_pl/flower/bindings.py): the operator's sites.toml read with a clear
error for each mistake, and on every join, on every branch of the hello, a node holds a client only with the key
(or node id) named for it."""

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from flwr.app import ConfigRecord, RecordDict  # noqa: E402

from cosmos_pl.errors import ConfigError  # noqa: E402
from cosmos_pl.flower.bindings import load_site_keys  # noqa: E402
from cosmos_pl.flower.keys import main as flower_keys  # noqa: E402
from cosmos_pl.flower.server import FlowerClients  # noqa: E402

from test_flower_replies import N, _Scripted, _view, honest_hello  # noqa: E402


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Three sites' key pairs, each made as a site makes its own (cosmos-pl flower-keys --site)."""
    out = tmp_path_factory.mktemp("keys")
    for i in range(3):
        assert flower_keys(["--site", f"site_{i}", "--out", str(out)]) == 0
    return out


def _pem(keys, i) -> bytes:
    """The key as the SuperLink reports it for a node (PEM SubjectPublicKeyInfo, as Flower stores it)."""
    key = serialization.load_ssh_public_key((keys / f"site_{i}.pub").read_bytes())
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def test_a_site_makes_only_its_own_key_pair_and_never_overwrites_it(keys, capsys):
    assert sorted(p.name for p in keys.iterdir()) == ["site_0", "site_0.pub", "site_1", "site_1.pub", "site_2",
                                                      "site_2.pub"]
    assert (keys / "site_0").stat().st_mode & 0o777 == 0o600
    assert (keys / "site_0.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    before = (keys / "site_0").read_bytes()
    assert flower_keys(["--site", "site_0", "--out", str(keys)]) == 2
    assert "site_0 exists" in capsys.readouterr().err and (keys / "site_0").read_bytes() == before
    assert flower_keys(["--site", "../x", "--out", str(keys)]) == 2


def test_sites_toml_names_keys_by_file_text_or_node_id_and_each_mistake_is_one_clear_error(keys, tmp_path):
    text = (keys / "site_1.pub").read_text().strip()
    good = tmp_path / "sites.toml"
    good.write_text(f'[clients]\n0 = "{keys}/site_0.pub"\n1 = "{text}"\n2 = 4482718375\n')
    bound = load_site_keys(good, 3)
    assert bound.holders[2] == 4482718375
    assert bound.refusal(0, 7, _pem(keys, 0)) is None and bound.refusal(1, 8, _pem(keys, 1)) is None
    assert "is not the one sites.toml names for client 0" in bound.refusal(0, 7, _pem(keys, 1))
    assert bound.refusal(2, 4482718375, _pem(keys, 2)) is None
    assert "is not the node named for client 2" in bound.refusal(2, 99, _pem(keys, 2))
    assert "reports no key for node 7" in bound.refusal(0, 7, b"")
    for body, words in [('[clients]\n0 = 1\n1 = 2\n', "clients [2] are not named"),
                        ('[clients]\n0 = 1\n1 = 2\n2 = 3\n3 = 4\n', "clients.3 is not a client of this run (0..2)"),
                        ('[clients]\n0 = 1\n1 = 1\n2 = 3\n', "clients 0 and 1 name the same node"),
                        ('[clients]\n0 = "nope.pub"\n1 = 1\n2 = 2\n', "cannot read"),
                        ('[clients]\n0 = "ecdsa-sha2-nistp384 AAAA"\n1 = 1\n2 = 2\n', "not a public key"),
                        ('clients = 3\n', "needs a [clients] table"), ('[clients\n', "cannot be read as TOML")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(ConfigError, match=r"run config sites='.*bad\.toml': ") as err:
            load_site_keys(bad, 3)
        assert words in str(err.value), (words, str(err.value))
    with pytest.raises(ConfigError, match="no such file"):
        load_site_keys(tmp_path / "missing.toml", 3)


class _KeyedGrid:
    """Connected nodes with the keys the SuperLink registered for them (Grid.get_nodes' NodeInfo)."""

    def __init__(self, keys):
        self.keys = keys

    def get_node_ids(self):
        return list(self.keys)

    def get_nodes(self):
        return [SimpleNamespace(node_id=n, public_key=k) for n, k in self.keys.items()]


def test_every_branch_of_the_hello_is_bound_to_the_named_key(keys, tmp_path):
    (tmp_path / "sites.toml").write_text("[clients]\n" + "".join(f'{i} = "{keys}/site_{i}.pub"\n' for i in range(3)))
    bound = load_site_keys(tmp_path / "sites.toml", N)
    # node 100 + i holds key i; node 200 holds site_1's key and claims client 0 (its partition-id says so)
    grid = _KeyedGrid({**{100 + i: _pem(keys, i) for i in range(3)}, 200: _pem(keys, 1)})
    claims = {100: 0, 101: 1, 102: 2, 200: 0}
    clients = _Scripted.__new__(_Scripted)
    clients.script = {"query.hello": lambda n: RecordDict({"config": ConfigRecord(
        {**honest_hello(claims[n]), "data_mode": "site", "identity": f"{n:032x}"})})}
    grid.keys.pop(100)  # client 0's own node is down when the impostor says hello
    clients.site_keys = None
    with pytest.raises(Exception, match="only 2 of 3 clients joined"):
        FlowerClients.__init__(clients, _view(), grid=grid, config_yaml="seed: 0", num_clients=N, mode="deployment",
                               site_keys=bound, join_timeout_s=5)
    assert clients.node_of == {1: 101, 2: 102}
    assert [(f["node_id"], f["reason"]) for f in clients.join_failures] == [
        (200, "node 200's key is not the one sites.toml names for client 0: a client is held only by the key the "
              "operator named for it")]
    # the "my site's data cannot be used" branch is bound too: the impostor's SiteFailure takes nothing
    clients.script["query.hello"] = lambda n: RecordDict({"error": ConfigRecord(
        {"type": "SiteDataError", "reason": "no data.npz", "client_id": 0, "identity": f"{n:032x}"})})
    clients.join(1, wait=False)
    assert 0 not in clients.node_of and 0 not in clients.broken
    assert clients.join_failures[-1]["node_id"] == 200 and "names for client 0" in clients.join_failures[-1]["reason"]
    # client 0's own node is back: it joins
    grid.keys[100] = _pem(keys, 0)
    clients.script["query.hello"] = lambda n: RecordDict({"config": ConfigRecord(
        {**honest_hello(claims[n]), "data_mode": "site", "identity": f"{n:032x}"})})
    clients.join(2, wait=False)
    assert clients.node_of == {0: 100, 1: 101, 2: 102} and clients.joins[-1]["bound_by"] == "key"
