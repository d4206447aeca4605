"""A small certificate authority for a cluster's management plane: the CA, the controller's certificate (its names
and addresses), and one client certificate per host, named after the host (the name the controller checks against
the host a credential acts for: `controller.tls`).

What an operator with their own PKI skips: any CA works, as long as each host's certificate carries the host's
name (as a DNS subject alternative name, or as the common name)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825  # what browsers accept for a server certificate; rotation is documented (docs/security.md)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tianji"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a private key is its owner's only
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    tmp.replace(path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)


class Authority:
    """A CA kept in `dir` (ca.pem, ca.key); made on first use."""

    def __init__(self, dir: Path, name: str = "Tianji cluster CA") -> None:
        self.dir = Path(dir)
        self.cert_path, self.key_path = self.dir / "ca.pem", self.dir / "ca.key"
        if not self.cert_path.exists():
            self._create(name)
        self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        self.key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)

    def _create(self, name: str) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        _write_key(self.key_path, key)
        _write_cert(self.cert_path, cert)

    def issue(self, name: str, *, server_names: list[str] | None = None, client: bool = True,
              out: Path | None = None, days: int = VALID_DAYS) -> Issued:
        """A certificate for `name` (`out`/name.pem and name.key): a client certificate naming the host, and, with
        `server_names` (DNS names or IP addresses), a server certificate for those too."""
        out = Path(out or self.dir)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        alt: list[x509.GeneralName] = [x509.DNSName(name)]
        for n in server_names or []:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []) + \
                 ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(self.key, hashes.SHA256()))
        issued = Issued(out / f"{name}.pem", out / f"{name}.key")
        _write_key(issued.key, key)
        _write_cert(issued.cert, cert)
        return issued
