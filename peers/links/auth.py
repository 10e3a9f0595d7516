"""Mutual HMAC challenge-response on every connection; the token never crosses the wire.

client -> hello{role, nonce_c}
server -> challenge{nonce_s, proof_s = HMAC(token, "server" | nonce_c | nonce_s)}
client checks proof_s (it reached someone who holds the token), then
client -> auth{proof_c = HMAC(token, "client" | nonce_c | nonce_s)}
server checks proof_c -> welcome, or error and close.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

from peers.links.channel import Channel, ChannelClosed

NONCE = 32
HANDSHAKE_S = 10.0  # a connection that does not finish the handshake in time is dropped


class AuthError(Exception):
    pass


def new_token() -> str:
    """96 random bits, URL-safe; never starting with '-', which a command line would take for an option."""
    while (t := secrets.token_urlsafe(12)).startswith("-"):
        pass
    return t


def _proof(token: str, side: bytes, nc: bytes, ns: bytes) -> bytes:
    return hmac.new(token.encode(), side + nc + ns, hashlib.sha256).digest()


async def client_handshake(ch: Channel, token: str, role: str, **hello) -> dict:
    """Prove we hold the token and check the server does too. Returns the server's welcome."""
    nc = secrets.token_bytes(NONCE)
    await ch.send({"t": "hello", "role": role, "nonce": nc, **hello})
    try:
        msg = await ch.recv(timeout=HANDSHAKE_S)
    except ChannelClosed as e:
        raise AuthError(f"the other side hung up before the handshake ({e}); if its ring uses TLS, "
                        "use the exact command from its invite (with --tls)") from None
    if msg["t"] == "error":
        raise AuthError(str(msg.get("error")))
    ns = msg.get("nonce")
    if msg["t"] != "challenge" or not isinstance(ns, bytes) or len(ns) != NONCE:
        raise AuthError("the other side did not answer the handshake")
    if not hmac.compare_digest(_proof(token, b"server", nc, ns), msg.get("proof", b"")):
        await ch.aclose()
        raise AuthError("the other side does not hold this token (wrong token, or not the real host)")
    await ch.send({"t": "auth", "proof": _proof(token, b"client", nc, ns)})
    msg = await ch.recv(timeout=HANDSHAKE_S)
    if msg["t"] == "error":
        raise AuthError(str(msg.get("error")))
    if msg["t"] != "welcome":
        raise AuthError(f"unexpected reply {msg['t']!r} to the handshake")
    return msg


async def server_handshake(ch: Channel, token: str, welcome: dict | None = None) -> dict:
    """Check a new connection's proof. Returns its hello; raises AuthError after telling it why."""
    hello = await ch.recv(timeout=HANDSHAKE_S)
    nc = hello.get("nonce")
    if hello["t"] != "hello" or not isinstance(nc, bytes) or len(nc) != NONCE or not isinstance(hello.get("role"), str):
        await ch.error("expected a hello")
        raise AuthError("a connection did not start with a hello")
    ns = secrets.token_bytes(NONCE)
    await ch.send({"t": "challenge", "nonce": ns, "proof": _proof(token, b"server", nc, ns)})
    try:
        msg = await ch.recv(timeout=HANDSHAKE_S)
    except ChannelClosed:
        raise AuthError("the joiner hung up during the handshake (it may hold another token)") from None
    if msg["t"] != "auth" or not hmac.compare_digest(_proof(token, b"client", nc, ns), msg.get("proof", b"") if isinstance(msg.get("proof"), bytes) else b""):
        await ch.error("wrong token")
        raise AuthError("refused a connection with a wrong token")
    await ch.send({"t": "welcome", **(welcome or {})})
    return hello
