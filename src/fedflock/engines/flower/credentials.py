"""Certificates and keys for a TLS deployment with node authentication (`fedflock deploy init`).

A private certificate authority signs the SuperLink's certificate (valid for the addresses the
nodes dial: 127.0.0.1 and localhost, plus any host given); every SuperNode gets an ECDSA P-384
key pair in OpenSSH format, the format `flower-supernode --auth-supernode-private-key` reads and
`flwr supernode register` takes. Keys are written readable by their owner only. This is what a
loopback or LAN test bed needs; a production deployment uses its organisation's CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class Credentials:
    """Where `write_credentials` put everything (all paths absolute)."""

    folder: Path
    nodes: int

    @property
    def ca_certificate(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def server_certificate(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    def node_key(self, node: int) -> Path:
        return self.folder / f"node{node}.key"

    def node_public_key(self, node: int) -> Path:
        return self.folder / f"node{node}.pub"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedflock test bed"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_TRUNC
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _hosts(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in ["127.0.0.1", "localhost", *hosts]:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return list(dict.fromkeys(names))


def write_credentials(folder: Path, nodes: int, hosts: list[str] | None = None) -> Credentials:
    """A CA, a server certificate for `hosts` (and loopback) signed by it, and `nodes` node key
    pairs, written to `folder` (created; existing files are replaced, and the key pairs of
    nodes beyond `nodes` removed, so the folder holds one deployment's credentials)."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    # Valid from yesterday: devices without a real-time clock often run behind.
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    until = now + datetime.timedelta(days=VALID_DAYS)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("fedflock CA"))
          .issuer_name(_name("fedflock CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA384()))

    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (x509.CertificateBuilder().subject_name(_name("fedflock SuperLink"))
              .issuer_name(ca.subject).public_key(server_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now)
              .not_valid_after(until)
              .add_extension(x509.SubjectAlternativeName(_hosts(hosts or [])), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .sign(ca_key, hashes.SHA384()))

    credentials = Credentials(folder, nodes)
    credentials.ca_certificate.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(folder / "ca.key", _pem_key(ca_key))
    credentials.server_certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_private(credentials.server_key, _pem_key(server_key))
    for node in range(nodes):
        write_node_key(credentials.node_key(node))
    for stale in folder.glob("node*.*"):
        index = stale.stem.removeprefix("node")
        if stale.suffix in (".key", ".pub") and index.isdigit() and int(index) >= nodes:
            stale.unlink()
    return credentials


def write_node_key(path: Path) -> Path:
    """An ECDSA P-384 key pair for one SuperNode: `path` (private, OpenSSH) and `path.pub`
    (public, OpenSSH); returns the public key's path."""
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(path, key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    public = path.with_suffix(".pub")
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return public


LOOPBACK = ("127.0.0.1", "localhost", "::1")
CREDENTIAL_FILES = ("ca.crt", "ca.key", "server.pem", "server.key")


def existing_credentials(folder: Path) -> list[str]:
    """The files of an earlier `write_credentials` in `folder` (replacing them would lock out
    every SuperNode registered or provisioned with the old CA and keys)."""
    folder = Path(folder)
    names = [*CREDENTIAL_FILES, *(p.name for p in sorted(folder.glob("node*.key")))]
    return [name for name in names if (folder / name).exists()]


def deployment_commands(credentials: Credentials, host: str = "127.0.0.1", port: int = 9091,
                        config: str = "/abs/path/configs/flower_demo.yaml") -> str:
    """The exact commands that start a TLS deployment with node authentication from these
    credentials: SuperLink, the Flower CLI's connection, registration, SuperNodes, the run.
    The SuperLink listens on 127.0.0.1 unless told otherwise (Flower's default), so for nodes
    dialling another address it binds every interface (`--host 0.0.0.0`)."""
    c, n = credentials, credentials.nodes
    address = f"{host}:{port}"
    bind = "" if host in LOOPBACK else " --host 0.0.0.0"
    lines = [
        "# 1. the SuperLink (TLS; only registered SuperNodes are admitted)",
        f"flower-superlink --ssl-ca-certfile {c.ca_certificate} --ssl-certfile "
        f"{c.server_certificate} --ssl-keyfile {c.server_key} --enable-supernode-auth "
        f"--disable-runtime-dependency-installation{bind} --port {port}",
        "",
        "# 2. the Flower CLI's connection, in $FLWR_HOME/config.toml (default ~/.flwr/)",
        "#   [superlink.fedflock]",
        f'#   address = "{address}"',
        f'#   root-certificates = "{c.ca_certificate}"',
        "",
        "# 3. register every SuperNode's public key",
        *(f"flwr supernode register {c.node_public_key(i)} fedflock" for i in range(n)),
        "",
        "# 4. one SuperNode per client, on its device (copy ca.crt and its own node<i>.key there)",
        *(f"flower-supernode --root-certificates {c.ca_certificate} --auth-supernode-private-key "
          f"{c.node_key(i)} --superlink {address} --port {9100 + i} --node-config "
          f'"partition-id={i} num-partitions={n}"' for i in range(n)),
        "",
        "# 5. the run (config readable by the SuperLink and every SuperNode)",
        f'flwr run "$(fedflock flower-app)" fedflock --stream --run-config '
        f"'config=\"{config}\" out=\"/abs/path/runs/flower\"'",
    ]
    return "\n".join(lines)
