"""Only Twilio, for a call the webhook handed out, once: intruders' Media Streams against the
phone bot's real workers (2 uvicorn processes, the local Gemini Live server, SQLite and
PostgreSQL) while a real caller's call goes on. Every intruder is refused (403 at the
handshake, or 1008 after its `start`), writes nothing to any call's log, and the caller's
call runs to its goodbye on its one stream, never taken over."""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET

import pytest

from examples.phone_bot import stream_auth
from examples.phone_bot.stream_auth import StreamRefused, check, issue

from .rig import AUTH_TOKEN, rig

pytestmark = pytest.mark.timeout(240)

SECRET = b"k" * 32
CALL = "CA" + "1" * 32
TTL_S = 3.0


# ------------------------------------------------------------------ the decision, pure

def test_a_token_admits_its_call_at_its_epoch_within_its_ttl():
    token = issue(SECRET, CALL, 2, now_s=1000.0)
    assert check(SECRET, token, CALL, 2, now_s=1000.5, ttl_s=30).epoch == 2


@pytest.mark.parametrize("token, call, epoch, now, says", [
    (None, CALL, 0, 1000.0, "no stream token"),
    ("v1.0.1000000.abc", CALL, 0, 1000.0, "malformed"),
    ("v2.0.1000000.abc.def", CALL, 0, 1000.0, "malformed"),
    (issue(SECRET, "CA" + "2" * 32, 0, 1000.0), CALL, 0, 1000.0, "not issued for this call"),
    (issue(b"another key", CALL, 0, 1000.0), CALL, 0, 1000.0, "not issued for this call"),
    (issue(SECRET, CALL, 0, 1000.0), CALL, 0, 1031.0, "expired"),
    (issue(SECRET, CALL, 0, 1000.0), CALL, 0, 990.0, "in the future"),
    (issue(SECRET, CALL, 0, 1000.0), CALL, 1, 1001.0, "already used"),
], ids=["none", "short", "version", "other call", "other key", "expired", "future", "used"])
def test_a_token_is_refused_with_a_reason(token, call, epoch, now, says):
    with pytest.raises(StreamRefused, match=says):
        check(SECRET, token, call, epoch, now, ttl_s=30)


def test_a_tampered_epoch_or_time_breaks_the_mac():
    parts = issue(SECRET, CALL, 0, 1000.0).split(".")
    for i, value in ((1, "5"), (2, str(int(parts[2]) + 1))):
        forged = ".".join(parts[:i] + [value] + parts[i + 1:])
        with pytest.raises(StreamRefused, match="not issued for this call"):
            check(SECRET, forged, CALL, int(forged.split(".")[1]), 1000.0, ttl_s=30)


def test_the_secret_defaults_to_one_derived_from_the_auth_token():
    assert stream_auth.derive_secret("explicit", "auth") == b"explicit"
    derived = stream_auth.derive_secret(None, "auth")
    assert derived and derived != b"auth"  # (the auth token itself never signs tokens)
    assert stream_auth.derive_secret(None, None) is None


async def test_one_worker_admits_a_token_once():
    class Store:
        async def stream_head(self, call_sid):
            return None  # a new call: epoch 0

    gate = stream_auth.StreamGate(SECRET, 30.0, None, "wss://bot.test/ws")
    token = await gate.token_for(Store(), CALL)
    await gate.admit(Store(), CALL, token)
    with pytest.raises(StreamRefused, match="already used on this worker"):
        await gate.admit(Store(), CALL, token)


# ------------------------------------------------------------------ intruders, real workers

@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_intruders_are_refused_and_the_callers_stream_goes_on(db, tmp_path):
    async with rig(db, tmp_path, workers=2, env={"STREAM_TOKEN_TTL_S": str(TTL_S)}) as r:
        caller, running = await r.call_heard(1)
        mine = r.worker_at(caller.streams[-1].worker)
        other = r.another_worker(mine.url)
        real = {p.get("name"): p.get("value")
                for p in ET.fromstring(caller.webhooks[0].twiml).iter("Parameter")}
        unknown = "CA" + "9" * 32
        another = r.phone_call(2)  # a call the webhook saw: its token is not for CALL
        other_token = (await r.twiml_parameters(another))["stream_token"]

        intrusions = {
            "no signature": await r.intrude(other, caller.call_sid, real, auth_token=None),
            "another account's signature": await r.intrude(other, caller.call_sid, real,
                                                           auth_token="not-" + AUTH_TOKEN),
            "unknown call, no token": await r.intrude(other, unknown, {}),
            "unknown call, another call's token": await r.intrude(
                other, unknown, {"stream_token": other_token}),
            "live call, no token": await r.intrude(other, caller.call_sid, {}),
            "live call, another call's token": await r.intrude(
                other, caller.call_sid, {"stream_token": other_token}),
            "live call, replayed token, other worker": await r.intrude(
                other, caller.call_sid, real),
            "live call, replayed token, same worker": await r.intrude(
                mine, caller.call_sid, real),
        }
        fresh = await r.twiml_parameters(caller)  # handed out, never used: it expires
        await asyncio.sleep(TTL_S + 0.5)
        intrusions["live call, expired token"] = await r.intrude(other, caller.call_sid, fresh)

        await asyncio.wait_for(running, 120)
        accepted = {what: i for what, i in intrusions.items() if not i.refused}
        assert not accepted, accepted
        assert intrusions["no signature"].handshake_status == 403
        assert intrusions["another account's signature"].handshake_status == 403
        reasons = {what: i.close_reason for what, i in intrusions.items()}
        assert "expired" in reasons["live call, expired token"], reasons
        assert "already used" in reasons["live call, replayed token, other worker"], reasons

        # The caller's call: one stream, never taken over, ended by their hang-up.
        assert caller.error is None and caller.hung_up_at is not None, caller
        assert len(caller.streams) == 1 and caller.streams[0].ended_by == "caller"
        records = await r.closed_records(caller.call_sid)
        types = [rec.type for rec in records]
        assert types.count("session.opened") == 1 and "session.worker_attached" not in types
        assert [rec.data["reason"] for rec in records if rec.type == "session.closed"] == \
            ["ended"]
        assert await r.records(unknown) == []  # nothing logged for a call nobody placed
        assert await r.records(another.call_sid) == []
        logs = r.worker_log(other) + r.worker_log(mine)
        assert logs.count("refused the media stream of call") == len(intrusions) - 2
        assert logs.count("no valid X-Twilio-Signature") == 2
        print(f"\n{db}: {len(intrusions)} intruders, 0 accepted; "
              + "; ".join(f"{k}: {v.handshake_status or v.close_code}"
                          for k, v in intrusions.items()))
