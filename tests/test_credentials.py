"""`fedflock deploy init`: a CA, a SuperLink certificate it signed for the loopback addresses, and
one OpenSSH key pair per SuperNode, in the formats Flower reads; and the commands it prints.
(The deployment itself, TLS and node authentication included, runs in tests/test_flower.py.)"""

from __future__ import annotations

import ipaddress
import stat
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedflock.engines.flower.credentials import write_credentials
from tests.conftest import one_error_line


def test_the_server_certificate_is_signed_by_the_ca_for_the_addresses_nodes_dial(
        tmp_path: Path) -> None:
    credentials = write_credentials(tmp_path / "c", 3, hosts=["10.0.0.7", "hub.lan"])
    ca = x509.load_pem_x509_certificate(credentials.ca_certificate.read_bytes())
    server = x509.load_pem_x509_certificate(credentials.server_certificate.read_bytes())
    server.verify_directly_issued_by(ca)  # raises unless the CA signed it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.0.0.7")}
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "hub.lan"}


def test_node_keys_are_p384_pairs_in_openssh_format_readable_by_their_owner_only(
        tmp_path: Path) -> None:
    credentials = write_credentials(tmp_path / "c", 2)
    publics = set()
    for node in range(2):
        private = load_ssh_private_key(credentials.node_key(node).read_bytes(), None)
        public = load_ssh_public_key(credentials.node_public_key(node).read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
        assert stat.S_IMODE(credentials.node_key(node).stat().st_mode) == 0o600
        publics.add(credentials.node_public_key(node).read_text())
    assert len(publics) == 2  # every node its own key
    assert stat.S_IMODE(credentials.server_key.stat().st_mode) == 0o600


def test_deploy_init_writes_the_files_and_prints_the_commands(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedflock.cli import main

    monkeypatch.setattr(sys, "argv", ["fedflock", "deploy", "init", "--nodes", "2", "--out",
                                      str(tmp_path / "d")])
    main()  # returns on success (errors exit with status 2)
    out = capsys.readouterr().out
    folder = (tmp_path / "d").resolve()
    assert {p.name for p in folder.iterdir()} == {
        "ca.crt", "ca.key", "server.pem", "server.key", "node0.key", "node0.pub", "node1.key",
        "node1.pub"}
    assert f"--ssl-certfile {folder}/server.pem" in out and "--enable-supernode-auth" in out
    assert f"flwr supernode register {folder}/node1.pub" in out
    assert f"--auth-supernode-private-key {folder}/node0.key" in out
    assert '"partition-id=1 num-partitions=2"' in out
    assert "--host 0.0.0.0" not in out  # loopback only: Flower's default bind is enough


def test_deploy_init_binds_every_interface_for_nodes_on_other_machines(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's SuperLink listens on 127.0.0.1 by default: nodes dialling --host would find
    nothing there."""
    from fedflock.cli import main

    monkeypatch.setattr(sys, "argv", ["fedflock", "deploy", "init", "--nodes", "1", "--out",
                                      str(tmp_path / "d"), "--host", "192.168.1.10"])
    main()
    out = capsys.readouterr().out
    link = next(line for line in out.splitlines() if line.startswith("flower-superlink"))
    assert "--host 0.0.0.0 --port 9091" in link
    assert "--superlink 192.168.1.10:9091" in out


def test_deploy_init_keeps_existing_credentials_unless_forced(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedflock.cli import main

    folder = tmp_path / "d"
    write_credentials(folder, 3)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    one_error_line(*cli("deploy", "init", "--nodes", "2", "--out", str(folder)),
                   "already holds credentials (ca.crt, ca.key, server.pem, ...)")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    monkeypatch.setattr(sys, "argv", ["fedflock", "deploy", "init", "--nodes", "2", "--out",
                                      str(folder), "--force"])
    main()
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert set(after) == set(before) - {"node2.key", "node2.pub"}  # one deployment's keys
    assert after["ca.key"] != before["ca.key"] and after["node0.key"] != before["node0.key"]


def test_deploy_init_refuses_bad_input_in_one_line(tmp_path: Path, cli) -> None:
    one_error_line(*cli("deploy", "init", "--nodes", "0", "--out", str(tmp_path / "d")),
                   "--nodes")
    (tmp_path / "file").write_text("x")
    one_error_line(*cli("deploy", "init", "--nodes", "2", "--out", str(tmp_path / "file")),
                   "not a folder")
