"""A throw-away certificate authority for TLS tests: a CA, a broker certificate for the loopback
address, and client certificates for mutual TLS, all written as PEM files.

Generated per test run (nothing secret is checked in). Keys are EC P-256: quick to make on a
busy 2-core machine, and accepted by Java, OpenSSL (librdkafka) and Python's ssl alike.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_PEM = serialization.Encoding.PEM
_PKCS8 = serialization.PrivateFormat.PKCS8
_PLAIN = serialization.NoEncryption()


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as PEM files."""

    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "surplus-test"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(_PEM, _PKCS8, _PLAIN))
    path.chmod(0o600)


class TestCA:
    """A CA that issues server and client certificates into `directory`."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, name: str = "surplus test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = _name(name)
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        self.cert_path = directory / "ca.pem"
        self.cert_path.write_bytes(self._cert.public_bytes(_PEM))

    def issue(self, common_name: str, *, server: bool) -> Issued:
        """A leaf certificate: a server one names 127.0.0.1 and localhost."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(self._name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{common_name}.crt",
                        self.directory / f"{common_name}.key")
        issued.cert.write_bytes(cert.public_bytes(_PEM))
        _write_key(key, issued.key)
        return issued

    def keystore(self, issued: Issued) -> Path:
        """Key and certificate chain in one PEM file (the broker's PEM key store)."""
        path = self.directory / f"{issued.cert.stem}.keystore.pem"
        path.write_bytes(issued.key.read_bytes() + issued.cert.read_bytes()
                         + self.cert_path.read_bytes())
        path.chmod(0o600)
        return path


def untrusted_ca(directory: Path) -> Path:
    """The certificate of a CA that signed nothing this broker uses (for "wrong CA" tests)."""
    return TestCA(directory / "other-ca", name="someone else's CA").cert_path
