"""The worker's settings, from its environment (one place lists them all)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_MODEL = "models/gemini-2.5-flash-native-audio-preview"
DEFAULT_APOLOGY = ("Sorry, our assistant cannot take your call right now. Please call "
                   "again later. Goodbye.")


@dataclass(frozen=True)
class BotConfig:
    """
    DATABASE_URL       the shared log (postgresql+asyncpg://… for several hosts; sqlite+aiosqlite:///…
                       for workers on one host)
    DATABASE_SCHEMA    PostgreSQL schema of the log (optional)
    PUBLIC_URL         the address the telephony provider reaches, i.e. the load balancer's
                       (https://bot.example.com): the TwiML's stream URL and the signed URL
    TWILIO_AUTH_TOKEN  when set, webhooks without a valid X-Twilio-Signature are refused
    GOOGLE_API_KEY     Gemini's key (read here, never logged)
    GEMINI_BASE_URL, GEMINI_CA_CERT   another Gemini Live endpoint (the local server) and the
                       certificate to trust for it
    GEMINI_MODEL, TOOL_LEDGER, TOOL_LATENCY_S, MAX_CALLS
    STREAM_TOKEN_SECRET, STREAM_TOKEN_TTL_S   the key of the per-call stream tokens (default:
                       derived from TWILIO_AUTH_TOKEN) and their lifetime (30 s): stream_auth.py
    GEMINI_GIVE_UP_S, FALLBACK_NUMBER, APOLOGY   a call whose worker cannot reach Gemini for
                       that long (30 s) hears APOLOGY and is hung up, or is transferred to
                       FALLBACK_NUMBER when set: call_end.py
    TWILIO_ACCOUNT_SID, TWILIO_API_BASE_URL, CALL_LEASE_S   with the account (and the auth
                       token) a call whose worker is gone for CALL_LEASE_S (5 s) is redirected
                       through Twilio's REST API (another API address: a stand-in): rescue.py
    AUDIO_LEAD_S       the bot's audio kept buffered at Twilio ahead of the caller (0.2 s), so
                       a worker's loop busy for less than that is not heard (pacing.py); `off`
                       for pipecat's own pacing
    """

    database_url: str
    public_url: str
    database_schema: str | None = None
    twilio_auth_token: str | None = None
    google_api_key: str = ""
    gemini_base_url: str | None = None
    gemini_ca_cert: str | None = None
    model: str = DEFAULT_MODEL
    ledger_path: str = "tool-ledger.jsonl"
    tool_latency_s: float = 0.4
    max_calls: int = 50
    stream_token_secret: str | None = None
    stream_token_ttl_s: float = 30.0
    gemini_give_up_s: float = 30.0
    fallback_number: str | None = None
    apology: str = DEFAULT_APOLOGY
    twilio_account_sid: str | None = None
    twilio_api_base_url: str | None = None
    call_lease_s: float = 5.0
    audio_lead_s: float | None = 0.2  # None: pipecat's pacing

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> BotConfig:
        env = dict(os.environ if env is None else env)
        missing = [k for k in ("DATABASE_URL", "PUBLIC_URL") if not env.get(k, "").strip()]
        if missing:
            raise SystemExit(f"phone bot: set {' and '.join(missing)} (see examples/phone_bot/config.py)")
        public = env["PUBLIC_URL"].rstrip("/")
        if urlsplit(public).scheme not in ("http", "https") or not urlsplit(public).netloc:
            raise SystemExit(f"phone bot: PUBLIC_URL must be http(s)://host[:port], not {public!r}")
        if not env.get("GOOGLE_API_KEY") and not env.get("GEMINI_BASE_URL"):
            raise SystemExit("phone bot: set GOOGLE_API_KEY (or GEMINI_BASE_URL for a local server)")
        if env.get("GEMINI_CA_CERT") and not os.path.isfile(env["GEMINI_CA_CERT"]):
            raise SystemExit(f"phone bot: GEMINI_CA_CERT {env['GEMINI_CA_CERT']!r} is not a file")
        for key in ("STREAM_TOKEN_TTL_S", "CALL_LEASE_S"):
            if env.get(key) and _number(env, key, float, 1.0) == 0:
                raise SystemExit(f"phone bot: {key} must be a number > 0, not {env[key]!r}")
        return cls(
            database_url=env["DATABASE_URL"], public_url=public,
            database_schema=env.get("DATABASE_SCHEMA") or None,
            twilio_auth_token=env.get("TWILIO_AUTH_TOKEN") or None,
            google_api_key=env.get("GOOGLE_API_KEY") or "local-server-needs-no-key",
            gemini_base_url=env.get("GEMINI_BASE_URL") or None,
            gemini_ca_cert=env.get("GEMINI_CA_CERT") or None,
            model=env.get("GEMINI_MODEL") or DEFAULT_MODEL,
            ledger_path=env.get("TOOL_LEDGER") or "tool-ledger.jsonl",
            tool_latency_s=_number(env, "TOOL_LATENCY_S", float, 0.4),
            max_calls=_number(env, "MAX_CALLS", int, 50),
            stream_token_secret=env.get("STREAM_TOKEN_SECRET") or None,
            stream_token_ttl_s=_number(env, "STREAM_TOKEN_TTL_S", float, 30.0),
            gemini_give_up_s=_number(env, "GEMINI_GIVE_UP_S", float, 30.0),
            fallback_number=env.get("FALLBACK_NUMBER") or None,
            apology=env.get("APOLOGY") or DEFAULT_APOLOGY,
            twilio_account_sid=env.get("TWILIO_ACCOUNT_SID") or None,
            twilio_api_base_url=env.get("TWILIO_API_BASE_URL") or None,
            call_lease_s=_number(env, "CALL_LEASE_S", float, 5.0),
            audio_lead_s=(None if env.get("AUDIO_LEAD_S", "").strip().lower() == "off"
                          else _number(env, "AUDIO_LEAD_S", float, 0.2)))

    def store_options(self) -> dict:
        return {"schema": self.database_schema} if self.database_schema else {}

    def gemini_connection(self) -> dict:
        if not self.gemini_base_url:
            return {}
        return {"http_options": _http_options(self.gemini_base_url, self.gemini_ca_cert)}

    @property
    def stream_url(self) -> str:
        """The Media Streams websocket behind the load balancer (wss for https)."""
        parts = urlsplit(self.public_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return f"{scheme}://{parts.netloc}/ws"


@functools.cache
def _http_options(base_url: str, cert_path: str | None):
    """Built once per process: its TLS context is shared by every call (parsing a CA file per
    call blocks the event loop; service/client_options.py)."""
    if cert_path is None:  # a certificate the default bundle trusts
        return {"base_url": base_url}
    from service.local_live import http_options
    return http_options(base_url, cert_path)


def _number(env: dict[str, str], key: str, kind: type, default):
    text = env.get(key)
    if not text:
        return default
    what = "a whole number" if kind is int else "a number"
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not value >= 0:
        raise SystemExit(f"phone bot: {key} must be {what} >= 0, not {text!r}")
    return value
