"""Who may open a Media Stream: Twilio (its signature on the websocket handshake), for a call
the webhook handed out (a per-call stream token), once.

The token goes in the TwiML as `<Parameter name="stream_token">` and comes back in the
stream's `start` message (customParameters). It is an HMAC over the CallSid, the call's
fencing epoch when the webhook answered, the time it was issued and a nonce:

- another CallSid, a made-up one, or no token: the MAC does not match;
- older than the TTL: expired (Twilio opens the stream within a second or two);
- replayed after the stream it was made for opened: that stream's attach raised the call's
  epoch in the shared log, so the token's epoch is stale on every worker; a worker also
  remembers the nonces it admitted until they expire (two uses racing on one worker).

Checked before the call is opened or taken over, so a refused stream writes nothing to the
call's log. The decisions are pure (`issue`, `check`); `StreamGate` adds the clock, the
log's epoch and the remembered nonces.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field

from twilio.request_validator import RequestValidator

VERSION = "v1"
PARAMETER = "stream_token"
#: A token stamped this far in the future (another host's clock) is still taken.
CLOCK_SKEW_S = 5.0


class StreamRefused(Exception):
    """The stream is not admitted; `reason` is safe to log (it never holds the token)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Token:
    epoch: int
    issued_ms: int
    nonce: str


def _mac(secret: bytes, call_sid: str, epoch: int, issued_ms: int, nonce: str) -> str:
    message = f"{VERSION}|{call_sid}|{epoch}|{issued_ms}|{nonce}".encode()
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue(secret: bytes, call_sid: str, epoch: int, now_s: float,
          nonce: str | None = None) -> str:
    """A token for the next stream of `call_sid`, whose log is at fencing epoch `epoch`."""
    nonce = nonce or secrets.token_urlsafe(12)
    issued_ms = int(now_s * 1000)
    return ".".join([VERSION, str(epoch), str(issued_ms), nonce,
                     _mac(secret, call_sid, epoch, issued_ms, nonce)])


def check(secret: bytes, token: str | None, call_sid: str, epoch_now: int, now_s: float,
          ttl_s: float) -> Token:
    """The token, if it admits a stream of `call_sid` now; else StreamRefused."""
    if not token:
        raise StreamRefused("no stream token (the webhook did not hand this stream out)")
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != VERSION or not parts[1].isdigit() \
            or not parts[2].isdigit():
        raise StreamRefused("malformed stream token")
    epoch, issued_ms, nonce, mac = int(parts[1]), int(parts[2]), parts[3], parts[4]
    if not hmac.compare_digest(mac, _mac(secret, call_sid, epoch, issued_ms, nonce)):
        raise StreamRefused("stream token not issued for this call")
    # A spent token says so at any age: a replay reads as one, however slow the worker.
    if epoch != epoch_now:
        raise StreamRefused(f"stream token already used (issued at epoch {epoch}, the call "
                            f"is at epoch {epoch_now})")
    age_s = now_s - issued_ms / 1000
    if age_s > ttl_s:
        raise StreamRefused(f"stream token expired ({age_s:.1f} s old, TTL {ttl_s:g} s)")
    if age_s < -CLOCK_SKEW_S:
        raise StreamRefused(f"stream token issued {-age_s:.1f} s in the future")
    return Token(epoch, issued_ms, nonce)


def derive_secret(stream_token_secret: str | None, twilio_auth_token: str | None) -> bytes | None:
    """STREAM_TOKEN_SECRET, else a key derived from the auth token every worker has."""
    if stream_token_secret:
        return stream_token_secret.encode()
    if twilio_auth_token:
        return hmac.new(twilio_auth_token.encode(), b"phone-bot stream token",
                        hashlib.sha256).digest()
    return None


@dataclass
class StreamGate:
    """The checks with their I/O: Twilio's signature, the log's epoch, the clock."""

    secret: bytes | None
    ttl_s: float
    twilio_auth_token: str | None
    stream_url: str
    _admitted: dict[str, float] = field(default_factory=dict)  # nonce -> when it expires

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def signed_by_twilio(self, signature: str | None) -> bool:
        """Twilio signs the websocket handshake like a GET of the stream's URL (the
        public one, no parameters). Without an auth token there is nothing to check."""
        if not self.twilio_auth_token:
            return True
        return bool(signature) and RequestValidator(self.twilio_auth_token).validate(
            self.stream_url, {}, signature)

    async def token_for(self, store, call_sid: str, asked_at: float | None = None) -> str | None:
        """A token for the call's next stream, stamped `asked_at` (when the webhook was
        asked: a redirect's request follows the end of the call's previous stream)."""
        if self.secret is None:
            return None
        return issue(self.secret, call_sid, await _epoch(store, call_sid),
                     time.time() if asked_at is None else asked_at)

    async def admit(self, store, call_sid: str, token: str | None) -> Token | None:
        """Raise StreamRefused unless `token` admits this stream; it is then spent. The token
        (None when tokens are off) says when the webhook handed the stream out."""
        if self.secret is None:
            return None
        now = time.time()
        admitted = check(self.secret, token, call_sid, await _epoch(store, call_sid), now,
                         self.ttl_s)
        self._admitted = {n: t for n, t in self._admitted.items() if t > now}
        if admitted.nonce in self._admitted:
            raise StreamRefused("stream token already used on this worker")
        self._admitted[admitted.nonce] = admitted.issued_ms / 1000 + self.ttl_s + CLOCK_SKEW_S
        return admitted


async def _epoch(store, call_sid: str) -> int:
    head = await store.stream_head(call_sid)
    return head[2] if head else 0
