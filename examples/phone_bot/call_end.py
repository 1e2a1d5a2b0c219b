"""A call always ends, and a stream nobody serves is closed.

- Gemini unreachable: when the service gives up reaching it (GEMINI_GIVE_UP_S of failed
  connections), the call is logged as ended with reason `gemini_unreachable` in the same
  commit as the give-up (the service's policy, `END_CALL_ON_GIVE_UP`: decided on the log, and
  replayed), and this server closes the stream. Twilio then runs the TwiML's next verb, the `<Redirect>` to the webhook,
  which reads that reason in the log and answers an apology and a hang-up, or a transfer to
  FALLBACK_NUMBER (`verbs_for_closed_call`). Until Gemini answers again this worker's
  /readyz says 503, so the load balancer sends new calls elsewhere.
- Fenced: another worker took the call over (a second stream for the CallSid); this one
  closes its stream at once instead of holding the caller's line silent.
"""

from __future__ import annotations

import asyncio
import time

from loguru import logger
from twilio.twiml.voice_response import VoiceResponse

from .config import BotConfig

GEMINI_UNREACHABLE = "gemini_unreachable"
#: The service's Policy.end_call_on_give_up: the call's end is logged with the give-up.
END_CALL_ON_GIVE_UP = GEMINI_UNREACHABLE
#: How long a probe's answer stands (a 503 worker is asked by its balancer every few s).
PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 5.0


def verbs_for_closed_call(response: VoiceResponse, reason: str | None,
                          config: BotConfig) -> VoiceResponse:
    """What the webhook answers for a call the log says is over: a hang-up, unless it ended
    because Gemini could not be reached (then an apology, or the deployer's transfer)."""
    if reason == GEMINI_UNREACHABLE:
        if config.fallback_number:
            response.dial(config.fallback_number)
            return response
        response.say(config.apology)
    response.hangup()
    return response


async def close_reason(store, call_sid: str, version: int) -> str | None:
    """The reason the closed call's SessionClosed gives (its last event)."""
    last = await store.read(call_sid, from_version=version)
    return last[-1].data.get("reason") if last and last[-1].type == "session.closed" else None


class GeminiReach:
    """This worker's view of whether Gemini answers: lost when a call gives up on it,
    back once a probe (a real Live handshake) goes through."""

    def __init__(self, config: BotConfig):
        self._config = config
        self.lost_at: float | None = None
        self._probed_at = 0.0
        self._probe: asyncio.Task | None = None

    def lost(self) -> None:
        self.lost_at = self.lost_at or time.time()

    async def reachable(self) -> bool:
        if self.lost_at is None:
            return True
        if self._probe is None and time.monotonic() - self._probed_at >= PROBE_EVERY_S:
            self._probe = asyncio.create_task(self._handshake())
        if self._probe is not None:
            # Shielded: a readiness request that times out must not cancel the probe.
            done, _ = await asyncio.wait({self._probe}, timeout=PROBE_TIMEOUT_S)
            if done:
                probe, self._probe = self._probe, None
                self._probed_at = time.monotonic()
                if probe.result():
                    logger.info("Gemini answers again: ready for calls")
                    self.lost_at = None
        return self.lost_at is None

    async def _handshake(self) -> bool:
        from google import genai  # (the web app only needs it on this path)

        options = self._config.gemini_connection().get("http_options")
        client = genai.Client(api_key=self._config.google_api_key, http_options=options)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                async with client.aio.live.connect(model=self._config.model, config={}):
                    return True
        except Exception as exc:  # noqa: BLE001 - any failure: still unreachable
            logger.info(f"Gemini probe failed: {type(exc).__name__}: {str(exc)[:200]}")
            return False


def end_calls_that_cannot_go_on(llm, websocket, task, reach: GeminiReach) -> None:
    """Wire one call's service events to the stream: end it when Gemini is given up on,
    let it go when fenced."""

    @llm.event_handler("on_connection_given_up")
    async def on_connection_given_up(service, error):
        # The call's end is in the log already (END_CALL_ON_GIVE_UP, with the give-up).
        reach.lost()
        logger.warning(f"call {service.call_id}: Gemini unreachable ({error}); the call "
                       f"ended ({GEMINI_UNREACHABLE}): closing its stream")
        await _close_stream(websocket, "gemini unreachable")
        await task.cancel()

    @llm.event_handler("on_fenced")
    async def on_fenced(service):
        logger.warning(f"call {service.call_id}: taken over by another worker; closing this "
                       f"stream")
        await _close_stream(websocket, "call taken over by another worker")
        await task.cancel()


async def _close_stream(websocket, reason: str) -> None:
    try:
        await websocket.close(code=1000, reason=reason)
    except Exception as exc:  # noqa: BLE001 - already closed by the other side
        logger.debug(f"stream already closed: {exc}")
