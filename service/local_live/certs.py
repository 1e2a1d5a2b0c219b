"""A self-signed TLS certificate for the local Gemini Live server.

google-genai forces ``wss://`` whenever an API key is set, so an offline server must
speak TLS. The certificate is generated once with ``cryptography`` and cached in the
temp directory: generating a key costs tens of milliseconds, and the crash harness
starts many processes that must all trust the same certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_CACHE_NAME = "local_live_tls_v1"
_VALID_FOR = datetime.timedelta(days=3650)
_RENEW_BEFORE = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertificateFiles:
    """Paths of a PEM certificate and its private key."""

    cert_path: Path
    key_path: Path


def ensure_certificate(cache_dir: Path | None = None) -> CertificateFiles:
    """Return the cached certificate for 127.0.0.1, generating it if missing or expiring.

    The files are written into a fresh directory that is then renamed into place, so
    concurrent processes never see a certificate without its matching key.
    """
    root = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir())
    final = root / f"{_CACHE_NAME}_{os.getuid()}"
    files = CertificateFiles(final / "cert.pem", final / "key.pem")
    if _usable(files):
        return files
    if final.exists():
        shutil.rmtree(final, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{_CACHE_NAME}_", dir=root))
    _write_certificate(staging)
    try:
        os.rename(staging, final)
    except OSError:
        # Another process won the race; its certificate is as good as ours.
        shutil.rmtree(staging, ignore_errors=True)
    return files


def server_context(files: CertificateFiles) -> ssl.SSLContext:
    """TLS context the server presents to clients."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile=files.cert_path, keyfile=files.key_path)
    return context


def client_context(cert_path: Path | str) -> ssl.SSLContext:
    """TLS context that trusts exactly the local server's certificate (and verifies it)."""
    return ssl.create_default_context(cafile=str(cert_path))


def _usable(files: CertificateFiles) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(files.cert_path.read_bytes())
        files.key_path.stat()
    except (OSError, ValueError):
        return False
    now = datetime.datetime.now(datetime.timezone.utc)
    return cert.not_valid_after_utc - now > _RENEW_BEFORE


def _write_certificate(directory: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "local-gemini-live")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID_FOR)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    key_path = directory / "key.pem"
    key_path.write_bytes(key_pem)
    key_path.chmod(0o600)
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
