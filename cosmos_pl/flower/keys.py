"""``cosmos-pl flower-keys``: the certificates and keys of a TLS deployment with SuperNode authentication.

In a real federation each key is made where it is used: the operator makes the CA and the SuperLink's certificate
(``--nodes 0``), and each site makes its own SuperNode key pair on its own machine (``--site NAME``: ``NAME`` and
``NAME.pub``), keeps the private key there and sends only ``NAME.pub`` to the operator, who registers it and names
it for the site's client in ``sites.toml`` (:mod:`cosmos_pl.flower.bindings`); ``make deploy-demo`` and the
localhost deployment test do the same, one folder per site. ``--nodes N`` also makes N SuperNode key pairs beside the
CA, for a trial on one machine where one person holds every key.

Operator mode writes, into ``--out``:

- ``ca.crt`` (and ``ca.key``): a certificate authority of this federation, which every machine trusts;
- ``server.pem`` and ``server.key``: the SuperLink's TLS certificate for the names in ``--host`` (and
  ``localhost`` / ``127.0.0.1``), signed by that CA;
- with ``--nodes N``, ``node_<i>`` and ``node_<i>.pub``: SuperNode ``i``'s key pair (EC P-384, OpenSSH format, as
  Flower's ``--auth-supernode-private-key`` and ``flwr supernode register`` read them); ``--site NAME`` writes the
  same for one site.

The SuperLink (``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key
--enable-supernode-auth``) then accepts only the SuperNodes whose public key was registered (``flwr supernode register
site_0.pub``); a site's private key never leaves its machine. The keys are made with ``cryptography`` (the library
Flower itself uses for them); the private key files are readable by their owner only.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["make_keys", "make_site_key", "main"]


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
        files += _key_pair(out, f"node_{i}")
    return files


def _key_pair(out: Path, name: str) -> list[Path]:
    """A SuperNode key pair (EC P-384, OpenSSH format): ``out/name`` (owner-only) and ``out/name.pub``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = out / name, out / f"{name}.pub"
    _write(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                      serialization.NoEncryption()), private=True)
    _write(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return [private, public]


def make_site_key(out: Path, name: str) -> list[Path]:
    """Write one SuperNode key pair, ``out/name`` (private, owner-only) and ``out/name.pub``: a site's own key,
    made on the site's machine. Returns the files written.

    Raises:
        FileExistsError: ``out/name`` exists (a site's key is not overwritten: its registration would be lost).
    """
    out.mkdir(parents=True, exist_ok=True)
    private = out / name
    if private.exists():
        raise FileExistsError(f"{private} exists: a site keeps its key (its public key is registered); remove it "
                              "first to make a new one, then register the new .pub and unregister the old node")
    return _key_pair(out, name)


def main(argv: Optional[Sequence[str]] = None, prog: str = "cosmos-pl flower-keys") -> int:
    """The command (module docstring); returns its exit status (2 for a bad argument, after one line)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder to write the certificates and keys into")
    p.add_argument("--host", action="append", default=[], help="the SuperLink's host name or IP (may repeat)")
    p.add_argument("--nodes", type=int, default=1, help="SuperNode key pairs to make beside the CA, for a trial on "
                   "one machine (node_0 .. node_<N-1>); 0 in a real federation, where each site makes its own")
    p.add_argument("--site", metavar="NAME", help="make only this site's SuperNode key pair, NAME and NAME.pub, on "
                   "the site's machine; send NAME.pub to the operator, keep NAME")
    try:
        args = p.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    if args.site is not None:
        if args.host or "--nodes" in (argv or sys.argv[1:]):
            print("cosmos-pl: error: --site makes a site's key pair only; --host and --nodes are the operator's "
                  "(run them apart)", file=sys.stderr)
            return 2
        if not args.site or "/" in args.site or args.site.startswith("."):
            print(f"cosmos-pl: error: --site={args.site!r}: give a file name such as site_0", file=sys.stderr)
            return 2
        try:
            files = make_site_key(Path(args.out), args.site)
        except FileExistsError as err:
            print(f"cosmos-pl: error: {err}", file=sys.stderr)
            return 2
        print(f"cosmos-pl: wrote {files[0]} (keep it on this machine, readable by the SuperNode's user only) and "
              f"{files[1]} (send it to the operator)")
        return 0
    if args.nodes < 0:
        print(f"cosmos-pl: error: --nodes={args.nodes}: must be >= 0", file=sys.stderr)
        return 2
    files = make_keys(Path(args.out), args.host, args.nodes)
    nodes = f", node_0 .. node_{args.nodes - 1} with their .pub" if args.nodes else ""
    print(f"cosmos-pl: wrote {len(files)} files in {args.out}: ca.crt and ca.key (the CA's key: keep it offline), "
          f"server.pem/server.key (for "
          f"{', '.join(args.host) or 'localhost'}){nodes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
