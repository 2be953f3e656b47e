"""Which SuperNode key holds which client: the operator's ``sites.toml``, checked on every join.

Under SuperNode authentication the SuperLink admits only registered keys and gives each key its node id; what a node
says about itself (its ``partition-id``, its token) is only a claim. The operator names, for every client, the key of
the site that holds it, in a TOML file given as the run config's ``sites``::

    # client id = the public key file that site sent (relative to this file), its key's text, or the node id that
    # `flwr supernode register` printed for it
    [clients]
    0 = "keys/site_0.pub"
    1 = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQ..."
    2 = 4482718375

The server then lets a node hold client ``i`` only when the SuperLink reports the node's key as client ``i``'s (or its
node id as the one named): on every join and on every branch of the hello (:mod:`cosmos_pl.flower.joining`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from cosmos_pl.errors import ConfigError

__all__ = ["SiteKeys", "load_site_keys"]

_EXAMPLE = "[clients]\\n0 = \"keys/site_0.pub\"\\n1 = 4482718375"


def _key_numbers(text: bytes) -> Any:
    """The public numbers of an OpenSSH or PEM public key (comparable across the two encodings)."""
    from cryptography.hazmat.primitives import serialization

    text = text.strip()
    key = (serialization.load_pem_public_key(text) if text.startswith(b"-----BEGIN")
           else serialization.load_ssh_public_key(text))
    return key.public_numbers()


@dataclass(frozen=True)
class SiteKeys:
    """Client id -> the public key (its numbers) or the node id that may hold it.

    Attributes:
        path: the file they were read from.
        holders: client id -> public key numbers, or an ``int`` node id.
    """

    path: Path
    holders: dict[int, Union[int, Any]]

    def refusal(self, client: int, node_id: int, public_key: Optional[bytes]) -> Optional[str]:
        """Why the node ``node_id``, whose key the SuperLink reports as ``public_key`` (PEM; None or empty: none),
        may not hold ``client``; None when it may."""
        named = self.holders.get(client)
        if named is None:
            return f"client {client} is not named in {self.path.name}"
        if isinstance(named, int):
            if node_id == named:
                return None
            return (f"node {node_id} is not the node named for client {client} in {self.path.name} ({named}): a "
                    "client is held only by the key the operator named for it")
        if not public_key:
            return (f"the SuperLink reports no key for node {node_id}, and {self.path.name} names a key for client "
                    f"{client}: run the SuperLink with --enable-supernode-auth")
        try:
            same = _key_numbers(public_key) == named
        except (ValueError, TypeError):
            same = False
        if same:
            return None
        return (f"node {node_id}'s key is not the one {self.path.name} names for client {client}: a client is held "
                "only by the key the operator named for it")


def load_site_keys(path: Union[str, Path], num_clients: int) -> SiteKeys:
    """Read ``sites.toml`` (module docstring) for a run of ``num_clients`` clients.

    Raises:
        ConfigError: the file is missing or not TOML, a client of the run is not named, a client id is not one of
            the run's, a key cannot be read, or two clients name the same key or node; one line naming the field,
            the value and the fix.
    """
    path = Path(path).expanduser()
    where = f"run config sites='{path}'"
    try:
        table = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file; write one naming each client's key, e.g. {_EXAMPLE}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{where}: cannot be read as TOML ({err}); e.g. {_EXAMPLE}") from None
    clients = table.get("clients")
    if not isinstance(clients, dict):
        raise ConfigError(f"{where}: needs a [clients] table naming each client's key, e.g. {_EXAMPLE}")
    holders: dict[int, Any] = {}
    for key, value in clients.items():
        if not str(key).isdigit() or not 0 <= int(key) < num_clients:
            raise ConfigError(f"{where}: clients.{key} is not a client of this run (0..{num_clients - 1})")
        cid = int(key)
        if isinstance(value, int) and not isinstance(value, bool):
            holders[cid] = value
            continue
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: clients.{key} = {value!r}: give a .pub file, a key's text or a node id")
        text = value.strip()
        if not text.startswith(("ecdsa-", "ssh-", "-----BEGIN")):
            file = (path.parent / text).expanduser()
            try:
                text = file.read_text()
            except OSError as err:
                raise ConfigError(f"{where}: clients.{key} = {value!r}: cannot read {file} ({err.strerror}); give "
                                  "the .pub file that site sent") from None
        try:
            holders[cid] = _key_numbers(text.encode())
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{where}: clients.{key} = {value!r}: not a public key ({err}); give the .pub file "
                              "cosmos-pl flower-keys --site wrote") from None
    missing = sorted(set(range(num_clients)) - set(holders))
    if missing:
        raise ConfigError(f"{where}: clients {missing} are not named; name every client's key (a client not named "
                          "could never join)")
    seen: dict[Any, int] = {}
    for cid, named in sorted(holders.items()):
        mark = ("node", named) if isinstance(named, int) else ("key", named)
        if mark in seen:
            raise ConfigError(f"{where}: clients {seen[mark]} and {cid} name the same {mark[0]}: give each site its "
                              "own key")
        seen[mark] = cid
    return SiteKeys(path, holders)
