"""Optional TLS for peer connections (`tls = true` in the cluster file).

The launcher makes a per-cluster CA and one certificate per node (named by
the node, as a DNS SAN), and hands each daemon its key over stdin like the
secret. Clients check the daemon's certificate against the cluster CA and
the node name; the HMAC handshake inside TLS still proves the client knows
the cluster secret, so no client certificates are needed.
"""

from __future__ import annotations

import datetime
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class NodeCredentials:
    """PEM text of what one daemon needs: the CA certificate, its own certificate and key."""

    ca: str
    cert: str
    key: str

    def to_dict(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.cert, "key": self.key}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_cluster_credentials(cluster: str, nodes: list[str]) -> tuple[str, dict[str, NodeCredentials]]:
    """A fresh CA for `cluster` and a certificate per node; returns (CA PEM, node -> credentials)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"gmount cluster {cluster} CA"))
        .issuer_name(_name(f"gmount cluster {cluster} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM).decode()
    result = {}
    for node in nodes:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(node))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(node)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        result[node] = NodeCredentials(
            ca_pem,
            cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode(),
        )
    return ca_pem, result


def server_context(credentials: NodeCredentials) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # ssl can only load a key from a file: a private temporary file, deleted at once
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(credentials.cert + credentials.key)
        f.flush()
        context.load_cert_chain(f.name)
    return context


def client_context(ca_pem: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = True  # against the node name in the certificate
    return context
