"""The per-proxy certificate authority of terminate mode, and the bundle a kernel trusts.

One CA per proxy (so per kernel), made when the proxy starts: an EC P-256 key that lives only
in this process's memory (the TLS stack loads each leaf and its key from a file in a private
temporary directory, deleted right after loading), valid for :data:`CA_VALIDITY`, and
name-constrained to the hosts that have injected headers, so that even a leaked key cannot
vouch for any other name or IP.
Leaf certificates are made on demand per host and cached.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sunroom.network.policy import is_ip

__all__ = ["CA_VALIDITY", "ProxyCA", "ca_bundle"]

CA_VALIDITY = datetime.timedelta(days=7)
"""How long a proxy's CA and its leaves are valid (a kernel outliving it restarts its proxy)."""
_BACKDATE = datetime.timedelta(minutes=5)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _constraint(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_network(host))
    except ValueError:
        return x509.DNSName(host)


def _constraints(hosts: list[str]) -> x509.NameConstraints:
    """Names and IPs under ``hosts`` only; with no name (no IP) among them, no name (no IP).

    A type of name is constrained only when a subtree of that type is listed, so an absent
    type is closed explicitly: DNS names to the reserved ``invalid`` domain, IPs excluded.
    """
    permitted = [_constraint(h) for h in dict.fromkeys(hosts)]
    if not any(isinstance(p, x509.DNSName) for p in permitted):
        permitted.append(x509.DNSName("invalid"))
    excluded: list[x509.GeneralName] | None = None
    if not any(isinstance(p, x509.IPAddress) for p in permitted):
        excluded = [
            x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
            x509.IPAddress(ipaddress.ip_network("::/0")),
        ]
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded)


class ProxyCA:
    """A fresh CA constrained to ``hosts`` (names or IPs; a name covers its subdomains)."""

    def __init__(self, hosts: list[str]) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._not_before = now - _BACKDATE
        self._not_after = now + CA_VALIDITY
        subject = _name("sunroom egress proxy CA")
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
        )
        builder = builder.add_extension(_constraints(hosts), critical=True)
        self._cert = builder.sign(self._key, hashes.SHA256())
        self.pem: bytes = self._cert.public_bytes(serialization.Encoding.PEM)
        self._dir = Path(tempfile.mkdtemp(prefix="sunroom-ca-"))
        self._contexts: dict[str, ssl.SSLContext] = {}

    def leaf_pem(self, host: str) -> bytes:
        """A server certificate for ``host`` signed by this CA (PEM)."""
        cert = (
            x509.CertificateBuilder()
            # an IP as the CN would be read as a DNS name by name-constraint checks
            .subject_name(_name("IP leaf" if is_ip(host) else host[:64]))
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.SubjectAlternativeName([_general_name(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting ``host``'s leaf certificate (made once per host)."""
        cached = self._contexts.get(host)
        if cached is not None:
            return cached
        path = self._dir / f"leaf-{len(self._contexts)}.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(self.leaf_pem(host) + self.pem + _pem_key(self._leaf_key))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        context.load_cert_chain(path)
        path.unlink()
        self._contexts[host] = context
        return context

    def close(self) -> None:
        """Remove the private directory (the keys stay only in memory until collected)."""
        for leftover in self._dir.iterdir():
            leftover.unlink()
        self._dir.rmdir()


def ca_bundle(ca_pem: bytes) -> bytes:
    """The system CA bundle with ``ca_pem`` appended: what a terminate-mode kernel trusts.

    The system bundle is ``ssl.get_default_verify_paths().cafile`` when that file exists,
    else certifi's when certifi is installed, else nothing (the bundle is the CA alone).
    """
    cafile: str | None = ssl.get_default_verify_paths().cafile
    if cafile is None or not os.path.isfile(cafile):
        try:
            import certifi
        except ImportError:
            cafile = None
        else:
            cafile = certifi.where()
    system = Path(cafile).read_bytes() if cafile else b""
    if system and not system.endswith(b"\n"):
        system += b"\n"
    return system + ca_pem
