"""TLS for peer connections (`tls = true`; the default for clusters launched over SSH).

The launcher makes a per-cluster CA and one certificate per node, and hands
each daemon its key over stdin like the secret. A certificate names its node
by `certificate_name` -- the node's name keyed with the cluster secret, as a
DNS SAN -- because certificates (and the name a client asks for, in the clear)
cross the wire before the peer proved anything: only members of the cluster
can tell which node a certificate is for, or which cluster (the CA's subject
names none). TLS is mutual: a daemon presents its certificate when it connects to
a peer as well, and a daemon refuses, in the TLS handshake already, a client
without a certificate from the cluster CA; after it, the name the client's
hello claims must be one its certificate was made for. Clients outside the
cluster (the CLI, the library) get a short-lived certificate of their own
from the CA key the launcher keeps (`ClusterCA.issue_client`). The HMAC
handshake inside TLS still proves that both ends know the cluster secret.

Keys never touch a file system: the ssl module loads a certificate chain only
from a path, so it reads the key from an anonymous in-memory file
(memfd_create) through /proc/self/fd.

Lifetimes: a fresh CA (valid CA_VALIDITY) and node certificates (valid
NODE_VALIDITY) at every `gmount up` of a stopped cluster. `gmount up` on a
running cluster reissues, from the same CA, the node certificates with less
than RENEW_WITHIN left and hands them to the running daemons; a CA that
close to its end needs `gmount down` and `gmount up`.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_VALIDITY = datetime.timedelta(days=365)
NODE_VALIDITY = datetime.timedelta(days=90)
#: A certificate a client outside the cluster makes for itself from the CA key, for one process.
CLIENT_VALIDITY = datetime.timedelta(days=1)
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


def certificate_name(node: str, secret: bytes) -> str:
    """The name `node`'s certificates carry: a DNS label only holders of the cluster secret can compute."""
    digest = hmac.new(secret, b"gmount certificate name\0" + node.encode(), hashlib.sha256).hexdigest()
    return f"g{digest[:40]}.gmount"


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
        """A new CA for `cluster` (whose name stays out of the certificate: it crosses the wire)."""
        now = now or _now()
        ca_key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(f"gmount CA {os.urandom(8).hex()}")  # no cluster name: the subject crosses the wire
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
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

    def issue(self, node: str, *, secret: bytes, validity: datetime.timedelta = NODE_VALIDITY,
              now: datetime.datetime | None = None) -> NodeCredentials:
        """A new key and certificate for `node` (to serve and to connect), never valid beyond the CA itself."""
        return self._issue(certificate_name(node, secret), validity, now,
                           [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH])

    def issue_client(self, name: str, *, secret: bytes, validity: datetime.timedelta = CLIENT_VALIDITY,
                     now: datetime.datetime | None = None) -> NodeCredentials:
        """A certificate for a client outside the cluster calling itself `name`: it may connect, not serve."""
        return self._issue(certificate_name(name, secret), validity, now,
                           [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH])

    def _issue(self, dns_name: str, validity: datetime.timedelta, now: datetime.datetime | None,
               usages: list[x509.ObjectIdentifier]) -> NodeCredentials:
        now = now or _now()
        ca_cert = x509.load_pem_x509_certificate(self.cert.encode())
        ca_key = serialization.load_pem_private_key(self.key.encode(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(dns_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return NodeCredentials(self.cert, cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))


def make_cluster_credentials(cluster: str, nodes: list[str], secret: bytes) -> tuple[str, dict[str, NodeCredentials]]:
    """A fresh CA for `cluster` and a certificate per node; returns (CA PEM, node -> credentials)."""
    ca = ClusterCA.create(cluster)
    return ca.cert, {node: ca.issue(node, secret=secret) for node in nodes}


def expires(pem: str) -> datetime.datetime:
    """When a PEM certificate stops being valid (UTC)."""
    return x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc


def expiring(pem: str, within: datetime.timedelta | None = None, now: datetime.datetime | None = None) -> bool:
    """True if the certificate has less than `within` (default RENEW_WITHIN) left."""
    return expires(pem) - (now or _now()) < (RENEW_WITHIN if within is None else within)


def certificate_problem(credentials: NodeCredentials, node: str, secret: bytes,
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
    if certificate_name(node, secret) not in names:
        return (f"the TLS certificate given to node {node} is made for another node (or another cluster "
                f"secret): {renew}")
    return None


def server_context(credentials: NodeCredentials) -> ssl.SSLContext:
    """A daemon's listening side: presents its certificate, requires one from the cluster CA of every client."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=credentials.ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    load_credentials(context, credentials)
    return context


def load_credentials(context: ssl.SSLContext, credentials: NodeCredentials) -> None:
    """Install a certificate and key in a context; connections made later present them."""
    with _in_memory_file((credentials.cert + credentials.key).encode()) as path:
        context.load_cert_chain(path)


@contextmanager
def _in_memory_file(data: bytes) -> Iterator[str]:
    """A path that reads `data` from an anonymous file in memory, for the block only.

    The ssl module loads keys from paths only; a file in /tmp (even mode 0600)
    would put key material on a shared file system, where it may outlive a
    crash. A memfd has no name in any directory and goes away with its last
    descriptor.
    """
    fd = os.memfd_create("gmount-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)  # a few KiB: one write
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def client_context(ca_pem: str, credentials: NodeCredentials | None = None) -> ssl.SSLContext:
    """The connecting side: checks the daemon's certificate (CA and node name) and presents `credentials`."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = True  # against the node name in the certificate
    if credentials is not None:
        load_credentials(context, credentials)
    return context


def certificate_names(certificate: dict[str, Any] | None) -> list[str]:
    """The node names (DNS SANs) of a peer certificate as ssl's getpeercert() gives it."""
    if not certificate:
        return []
    return [value for kind, value in certificate.get("subjectAltName", ()) if kind == "DNS"]
