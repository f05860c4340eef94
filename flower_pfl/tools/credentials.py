"""Credentials for a deployment: a TLS certificate authority and SuperLink certificate, and the
key pairs SuperNodes authenticate with.

    python -m flower_pfl credentials tls certs/ --host 127.0.0.1 --host localhost
    python -m flower_pfl credentials node-key keys/node0

``tls`` writes ``ca.crt`` (give it to SuperNodes and ``flwr``), ``server.pem`` and ``server.key``
(the SuperLink's), and ``ca.key``. ``node-key`` writes an ECDSA P-384 private key in OpenSSH
format (the SuperNode's ``--auth-supernode-private-key``) and its ``.pub`` (``flwr supernode
register``). For production, use your organisation's CA; these are for trying a deployment.

Private keys are created with mode 0600 and public files with 0644 (whatever the umask), each
before its first byte is written. Existing files are never overwritten unless ``--force`` is given
(``force=True``): then each is replaced by a complete new file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import secrets
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from flower_pfl.engine.extras import require

require("cryptography", why="TLS certificates and SuperNode keys")

from cryptography import x509  # noqa: E402  (after the check above)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, rsa  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

PRIVATE_MODE, PUBLIC_MODE = 0o600, 0o644


def refuse_existing(paths: Iterable[Path], force: bool = False) -> None:
    """Raise ``FileExistsError`` naming every one of ``paths`` that exists, unless ``force``."""
    existing = [str(p) for p in paths if os.path.lexists(p)]
    if existing and not force:
        raise FileExistsError(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
                              "nothing was written (--force overwrites)")


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_new_file(path: Path, data: bytes, mode: int, force: bool = False) -> None:
    """Write ``data`` to ``path`` as a new file that has ``mode`` before its first byte (the umask
    does not widen or narrow it). ``force`` writes a temporary file beside ``path`` that replaces it."""
    target = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp") if force else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)  # os.open's mode is masked by the umask
            _write_fd(fd, data)
        finally:
            os.close(fd)
        if force:
            os.replace(target, path)
    except BaseException:
        if force:
            target.unlink(missing_ok=True)
        raise


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_tls_certificates(out_dir: str | Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 365, *,
                           force: bool = False) -> dict[str, Path]:
    """A CA and a server certificate it signs, valid for ``hosts`` (the SuperLink's addresses as
    clients dial them). Returns the paths by name: ``ca``, ``certificate``, ``key``, ``ca_key``.
    Refuses (``FileExistsError``) when any of them exists, unless ``force``."""
    if not hosts:
        raise ValueError("the certificate needs at least one host name or IP address")
    out = Path(out_dir)
    paths = {"ca": out / "ca.crt", "certificate": out / "server.pem", "key": out / "server.key", "ca_key": out / "ca.key"}
    refuse_existing(paths.values(), force)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    valid = {"not_valid_before": now - dt.timedelta(minutes=5), "not_valid_after": now + dt.timedelta(days=days)}
    ca_key, server_key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flower-pfl CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(valid["not_valid_before"])
          .not_valid_after(valid["not_valid_after"])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
              .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    write_new_file(paths["ca_key"], _pem(ca_key), PRIVATE_MODE, force)
    write_new_file(paths["key"], _pem(server_key), PRIVATE_MODE, force)
    write_new_file(paths["ca"], ca.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE, force)
    write_new_file(paths["certificate"], server.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE, force)
    return paths


def write_node_key(path: str | Path, *, force: bool = False) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format: ``path`` (private) and ``path.pub`` (public).
    Refuses (``FileExistsError``) when either exists, unless ``force``."""
    private = Path(path)
    public = private.with_name(private.name + ".pub")
    refuse_existing((private, public), force)
    private.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    write_new_file(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                             serialization.NoEncryption()), PRIVATE_MODE, force)
    write_new_file(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n",
                  PUBLIC_MODE, force)
    return private, public


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flower_pfl credentials", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tls = sub.add_parser("tls", help="a CA and a SuperLink certificate")
    tls.add_argument("out_dir")
    tls.add_argument("--host", action="append", help="the SuperLink's IP address or DNS name (repeatable; default 127.0.0.1, localhost)")
    tls.add_argument("--days", type=int, default=365)
    key = sub.add_parser("node-key", help="a SuperNode's authentication key pair")
    key.add_argument("path")
    for command in (tls, key):
        command.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)
    try:
        if args.command == "tls":
            paths = write_tls_certificates(args.out_dir, args.host or ("127.0.0.1", "localhost"), args.days, force=args.force)
            print("\n".join(f"{name}: {path}" for name, path in paths.items()))
        else:
            print("\n".join(map(str, write_node_key(args.path, force=args.force))))
    except FileExistsError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
