"""``cosmos-pl flower-keys``: the certificates and keys of a TLS deployment with SuperNode authentication.

Writes, into ``--out``:

- ``ca.crt`` (and ``ca.key``): a certificate authority of this federation, which every machine trusts;
- ``server.pem`` and ``server.key``: the SuperLink's TLS certificate for the names in ``--host`` (and
  ``localhost`` / ``127.0.0.1``), signed by that CA;
- ``node_<i>`` and ``node_<i>.pub``: SuperNode ``i``'s key pair (EC P-384, OpenSSH format, as Flower's
  ``--auth-supernode-private-key`` and ``flwr supernode register`` read them).

The SuperLink (``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key
--enable-supernode-auth``) then accepts only the SuperNodes whose public key was registered (``flwr supernode register
node_<i>.pub``); copy ``node_<i>`` to site i alone. The keys are made with ``cryptography`` (the library Flower itself
uses for them); the private key files are readable by their owner only.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["make_keys", "main"]


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_keys(out: Path, hosts: list[str], nodes: int, days: int = 365) -> list[Path]:
    """Write the CA, the SuperLink's certificate for ``hosts`` and ``nodes`` SuperNode key pairs into ``out``;
    returns the files written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM

    def private_pem(key) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cosmos-pl federation CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, "localhost", "127.0.0.1"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "localhost")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .sign(ca_key, hashes.SHA256()))
    files = [out / "ca.crt", out / "ca.key", out / "server.pem", out / "server.key"]
    _write(files[0], ca.public_bytes(pem))
    _write(files[1], private_pem(ca_key), private=True)
    _write(files[2], server.public_bytes(pem))
    _write(files[3], private_pem(server_key), private=True)
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        _write(out / f"node_{i}", key.private_bytes(pem, serialization.PrivateFormat.OpenSSH,
                                                    serialization.NoEncryption()), private=True)
        _write(out / f"node_{i}.pub", key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                   serialization.PublicFormat.OpenSSH))
        files += [out / f"node_{i}", out / f"node_{i}.pub"]
    return files


def main(argv: Optional[Sequence[str]] = None, prog: str = "cosmos-pl flower-keys") -> int:
    """The command (module docstring); returns its exit status (2 for a bad argument, after one line)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder to write the certificates and keys into")
    p.add_argument("--host", action="append", default=[], help="the SuperLink's host name or IP (may repeat)")
    p.add_argument("--nodes", type=int, default=1, help="SuperNode key pairs to make (node_0 .. node_<N-1>)")
    try:
        args = p.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    if args.nodes < 0:
        print(f"cosmos-pl: error: --nodes={args.nodes}: must be >= 0", file=sys.stderr)
        return 2
    files = make_keys(Path(args.out), args.host, args.nodes)
    print(f"cosmos-pl: wrote {len(files)} files in {args.out}: ca.crt, server.pem/server.key (for "
          f"{', '.join(args.host) or 'localhost'}), node_0 .. node_{args.nodes - 1} with their .pub")
    return 0


if __name__ == "__main__":
    sys.exit(main())
