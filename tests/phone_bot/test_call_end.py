"""A call always ends, and a stream nobody serves is closed: the phone bot's real workers
(uvicorn processes, SQLite and PostgreSQL), the Twilio stand-in following the TwiML.

- Gemini unreachable: the caller hears the apology and is hung up (or is transferred), the
  call is logged as ended with reason `gemini_unreachable`, the stream is closed by the
  server, and the worker's /readyz says 503 until Gemini answers again.
- Fenced: a second stream for the CallSid takes the call over; the first worker closes its
  stream at once (it used to sit silent on it until the caller hung up)."""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET

import pytest
from twilio.twiml.voice_response import VoiceResponse

from examples.phone_bot.call_end import (END_CALL_ON_GIVE_UP, GEMINI_UNREACHABLE,
                                         verbs_for_closed_call)
from examples.phone_bot.config import DEFAULT_APOLOGY, BotConfig
from examples.phone_bot.tools import IDEMPOTENT
from session_store import Policy
from session_store.audit.replay import logged_decisions, replay

from .rig import rig

pytestmark = pytest.mark.timeout(240)

GIVE_UP_S = 3.0


def config(**kw) -> BotConfig:
    return BotConfig(database_url="sqlite+aiosqlite:///x.db", public_url="https://bot.test", **kw)


@pytest.mark.parametrize("reason, fallback, verbs", [
    ("ended", None, [("Hangup", None)]),
    (None, None, [("Hangup", None)]),
    (GEMINI_UNREACHABLE, None, [("Say", DEFAULT_APOLOGY), ("Hangup", None)]),
    (GEMINI_UNREACHABLE, "+15550009999", [("Dial", "+15550009999")]),
])
def test_what_the_webhook_answers_for_a_closed_call(reason, fallback, verbs):
    response = verbs_for_closed_call(VoiceResponse(), reason, config(fallback_number=fallback))
    assert [(v.tag, v.text) for v in ET.fromstring(str(response))] == verbs


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_call_gemini_cannot_serve_hears_an_apology_and_ends(db, tmp_path):
    async with rig(db, tmp_path, workers=2, gemini=False,
                   env={"GEMINI_GIVE_UP_S": str(GIVE_UP_S)}) as r:
        caller = await asyncio.wait_for(r.phone_call(1).run(r.http), 60)
        assert caller.error is None, caller.error
        assert caller.status == "completed" and caller.hung_up_at is None  # the bot ended it
        assert caller.said == [DEFAULT_APOLOGY] and caller.dialed == []
        [stream] = caller.streams
        held_s = stream.closed_at - stream.opened_at
        assert stream.ended_by == "bot" and held_s < GIVE_UP_S + 5, held_s
        # The webhook after the stream: Connect+Redirect, then the apology and the hang-up.
        assert [[v.tag for v in ET.fromstring(w.twiml)] for w in caller.webhooks] == [
            ["Connect", "Redirect"], ["Say", "Hangup"]]
        records = await r.closed_records(caller.call_sid)
        closed = [rec.data["reason"] for rec in records if rec.type == "session.closed"]
        assert closed == [GEMINI_UNREACHABLE]
        [given_up] = [rec for rec in records if rec.type == "anomaly.recorded"
                      and rec.data.get("kind") == "connection_given_up"]
        # The service ended the call with its give-up (Policy.end_call_on_give_up), in the
        # same decision; replay, with the bot's policy, decides both again.
        [ended] = [rec for rec in records if rec.type == "session.closed"]
        assert ended.version == given_up.version + 1, [rec.type for rec in records]
        report = replay(records, Policy(idempotent=IDEMPOTENT,
                                        end_call_on_give_up=END_CALL_ON_GIVE_UP))
        n = len(list(logged_decisions(records)))
        assert report.ok, [d.message for d in report.divergences]
        assert report.coverage == f"{n} of {n} decisions replayed", report.coverage

        served = r.worker_at(stream.worker)
        status, body = await r.readyz(served)
        assert (status, body["reason"]) == (503, "gemini unreachable")
        await r.server.start()  # Gemini is back: the worker's probe finds it
        deadline = time.monotonic() + 20
        while (await r.readyz(served))[0] != 200:
            assert time.monotonic() < deadline, "still not ready with Gemini answering"
            await asyncio.sleep(0.5)
        print(f"\n{db}: stream held {held_s:.1f} s (give up after {GIVE_UP_S} s); ready "
              f"again {time.monotonic() - deadline + 20:.1f} s after Gemini came back")


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_call_gemini_cannot_serve_is_transferred_when_configured(db, tmp_path):
    async with rig(db, tmp_path, workers=1, gemini=False,
                   env={"GEMINI_GIVE_UP_S": str(GIVE_UP_S),
                        "FALLBACK_NUMBER": "+15550009999"}) as r:
        caller = await asyncio.wait_for(r.phone_call(1).run(r.http), 60)
        assert caller.error is None and caller.dialed == ["+15550009999"] and not caller.said
        records = await r.closed_records(caller.call_sid)
        assert [rec.data["reason"] for rec in records if rec.type == "session.closed"] == \
            [GEMINI_UNREACHABLE]


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_fenced_worker_closes_its_stream(db, tmp_path):
    async with rig(db, tmp_path, workers=2) as r:
        caller, running = await r.call_heard(1)
        deadline = time.monotonic() + 60
        first = caller.streams[0]
        other = r.another_worker(first.worker)
        # A second stream for the call, as Twilio hands it out: it takes the call over.
        parameters = await r.twiml_parameters(caller)
        second = asyncio.create_task(r.intrude(other, caller.call_sid, parameters,
                                               listen_s=6.0))
        while first.closed_at is None:
            assert time.monotonic() < deadline + 30, "the fenced worker kept its stream open"
            await asyncio.sleep(0.05)
        records = await r.records(caller.call_sid)
        attached = [rec.recorded_at_us / 1e6 for rec in records
                    if rec.type == "session.worker_attached"]
        assert attached, [rec.type for rec in records]
        fenced_close_s = first.closed_at - attached[0]
        assert first.ended_by == "bot"
        # The second stream was admitted and had the call (it fenced the first). It may hear
        # nothing: the model holds the greeting already heard and waits for the caller.
        taken = await second
        assert taken.handshake_status is None and taken.close_code != 1008, taken
        await asyncio.wait_for(running, 120)  # (the stand-in redirects and goes on)
        assert caller.error is None, caller.error
        print(f"\n{db}: fenced worker closed its stream {fenced_close_s:.2f} s after the "
              f"takeover")
        assert fenced_close_s < 3.0
