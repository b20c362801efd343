"""TLS for peer connections (`tls = true`; the default for clusters launched over SSH).

The launcher makes a per-cluster CA and one certificate per node (named by
the node, as a DNS SAN), and hands each daemon its key over stdin like the
secret. Clients check the daemon's certificate against the cluster CA and
the node name; the HMAC handshake inside TLS still proves the client knows
the cluster secret, so no client certificates are needed.

Lifetimes: a fresh CA (valid CA_VALIDITY) and node certificates (valid
NODE_VALIDITY) at every `gmount up` of a stopped cluster. `gmount up` on a
running cluster reissues, from the same CA, the node certificates with less
than RENEW_WITHIN left and hands them to the running daemons; a CA that
close to its end needs `gmount down` and `gmount up`.
"""

from __future__ import annotations

import datetime
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_VALIDITY = datetime.timedelta(days=365)
NODE_VALIDITY = datetime.timedelta(days=90)
RENEW_WITHIN = datetime.timedelta(days=30)
VALIDITY = NODE_VALIDITY  # the name older callers used


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


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@dataclass(frozen=True)
class ClusterCA:
    """The cluster's CA: its certificate (public) and key (kept by the launcher, mode 0600, to reissue)."""

    cert: str
    key: str

    @classmethod
    def create(cls, cluster: str, *, validity: datetime.timedelta = CA_VALIDITY,
               now: datetime.datetime | None = None) -> ClusterCA:
        now = now or _now()
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name(f"gmount cluster {cluster} CA"))
            .issuer_name(_name(f"gmount cluster {cluster} CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        return cls(ca_cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(ca_key))

    def issue(self, node: str, *, validity: datetime.timedelta = NODE_VALIDITY,
              now: datetime.datetime | None = None) -> NodeCredentials:
        """A new key and certificate for `node`, never valid beyond the CA itself."""
        now = now or _now()
        ca_cert = x509.load_pem_x509_certificate(self.cert.encode())
        ca_key = serialization.load_pem_private_key(self.key.encode(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(node))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(node)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return NodeCredentials(self.cert, cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))


def make_cluster_credentials(cluster: str, nodes: list[str]) -> tuple[str, dict[str, NodeCredentials]]:
    """A fresh CA for `cluster` and a certificate per node; returns (CA PEM, node -> credentials)."""
    ca = ClusterCA.create(cluster)
    return ca.cert, {node: ca.issue(node) for node in nodes}


def expires(pem: str) -> datetime.datetime:
    """When a PEM certificate stops being valid (UTC)."""
    return x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc


def expiring(pem: str, within: datetime.timedelta | None = None, now: datetime.datetime | None = None) -> bool:
    """True if the certificate has less than `within` (default RENEW_WITHIN) left."""
    return expires(pem) - (now or _now()) < (RENEW_WITHIN if within is None else within)


def certificate_problem(credentials: NodeCredentials, node: str,
                        now: datetime.datetime | None = None) -> str | None:
    """Why a daemon must not serve with these credentials (expired, or not from its CA), or None."""
    now = now or _now()
    ca = x509.load_pem_x509_certificate(credentials.ca.encode())
    cert = x509.load_pem_x509_certificate(credentials.cert.encode())
    renew = "run `gmount down` and `gmount up` for this cluster to make new certificates"
    if ca.not_valid_after_utc <= now:
        return f"the CA certificate of this cluster expired on {ca.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: {renew}"
    if cert.not_valid_after_utc <= now:
        return (f"the TLS certificate of node {node} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: "
                f"{renew}")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"the TLS certificate given to node {node} was not issued by this cluster's CA: {renew}"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    if node not in names:
        return f"the TLS certificate given to node {node} is made for {', '.join(names)}: {renew}"
    return None


def server_context(credentials: NodeCredentials) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    load_credentials(context, credentials)
    return context


def load_credentials(context: ssl.SSLContext, credentials: NodeCredentials) -> None:
    """Install a certificate and key in a server context; connections made later present them."""
    # ssl can only load a key from a file: a private temporary file, deleted at once
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(credentials.cert + credentials.key)
        f.flush()
        context.load_cert_chain(f.name)


def client_context(ca_pem: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = True  # against the node name in the certificate
    return context
