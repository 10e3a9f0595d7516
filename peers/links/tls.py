"""TLS for ring links (`--tls`): a self-signed certificate per process, pinned by its SHA-256 fingerprint.

There is no certificate authority: the host's invite carries its fingerprint, the joiner checks it on every
connection it makes, and the host tells each member the fingerprint of its next hop. The HMAC token
handshake still runs inside the encrypted stream.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import ssl
from pathlib import Path

import trio

from peers.base.locations import data_dir


class PinError(OSError):
    """The other side's certificate is not the one we were told to expect."""


def ensure_cert(name: str = "host") -> tuple[Path, Path]:
    """This machine's certificate and key for `name`, made on first use and kept in the data dir."""
    d = data_dir() / "tls"
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    if cert.is_file() and key.is_file():
        return cert, key
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d.mkdir(parents=True, exist_ok=True)
    k = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sfchat {name}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=3650)).sign(k, hashes.SHA256()))
    tmp = key.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()))
    os.replace(tmp, key)
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    return cert, key


def fingerprint(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    return ctx


def client_context() -> ssl.SSLContext:
    # no CA to verify against: the certificate is checked by its pinned fingerprint right after the handshake
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def wrap_server(stream: trio.abc.Stream, ctx: ssl.SSLContext) -> trio.SSLStream:
    s = trio.SSLStream(stream, ctx, server_side=True)
    with trio.fail_after(10):
        await s.do_handshake()
    return s


class NotTLS(OSError):
    """The other side answered a TLS handshake in plain TCP."""


FINGERPRINT_CHARS = 64  # a SHA-256 in hex


def check_pin(pin: str) -> str:
    """A fingerprint as pasted (any case, colons allowed), or ValueError saying what is wrong with it."""
    digits = pin.strip().lower().replace(":", "")
    if len(digits) != FINGERPRINT_CHARS:
        raise ValueError(f"the --tls fingerprint has {len(digits)} of {FINGERPRINT_CHARS} characters (cut short when "
                         "pasted?): copy the whole value from the invite")
    if any(c not in "0123456789abcdef" for c in digits):
        raise ValueError("the --tls fingerprint is hexadecimal (0-9, a-f): copy it from the invite")
    return digits


async def wrap_client(stream: trio.abc.Stream, pin: str,
                      plain: str = "the host does not use TLS: drop --tls") -> trio.SSLStream:
    """A TLS connection to a peer whose certificate is `pin`; NotTLS(`plain`) when the other side is plain TCP."""
    s = trio.SSLStream(stream, client_context(), server_hostname=None)
    try:
        with trio.fail_after(10):
            await s.do_handshake()
    except trio.BrokenResourceError as e:
        if isinstance(e.__cause__, ssl.SSLError) and e.__cause__.reason == "WRONG_VERSION_NUMBER":
            raise NotTLS(plain) from None  # what came back was not a TLS record
        raise
    der = s.getpeercert(binary_form=True)
    got = hashlib.sha256(der).hexdigest() if der else ""
    if got != check_pin(pin):
        await trio.aclose_forcefully(s)
        raise PinError(f"TLS certificate fingerprint {got[:16]}… is not the expected {pin[:16]}… "
                       "(wrong address, or someone in between)")
    return s


class Endpoint:
    """One process's TLS identity, or none (plain TCP): wraps what it accepts, pins what it dials."""

    def __init__(self, enabled: bool, name: str):
        self.enabled = enabled
        self.fingerprint = ""
        if enabled:
            cert, key = ensure_cert(name)
            self.context, self.fingerprint = server_context(cert, key), fingerprint(cert)

    async def accept(self, stream: trio.abc.Stream) -> trio.abc.Stream:
        return await wrap_server(stream, self.context) if self.enabled else stream

    @staticmethod
    async def dial(stream: trio.abc.Stream, pin: str | None, **kw) -> trio.abc.Stream:
        return await wrap_client(stream, pin, **kw) if pin else stream
