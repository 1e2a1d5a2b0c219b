"""goAway timing: the reconnect before the deadline must not depend on when the goAway
could be logged."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from service.gemini_live import parse_time_left
from service.local_live import Audio, GoAway, Script, TurnComplete, WaitSignal
from session_store import Policy

from .helpers import Ctl, assert_log_settled, assert_server_clean, handles_of, run_call

pytestmark = pytest.mark.timeout(90)


@pytest.mark.stock_bug("goAway is ignored: the server closes the session at the deadline")
async def test_go_away_logged_late_still_reconnects_before_the_deadline(flavour):
    """The goAway arrives while another commit holds the log (here 0.3 s: a slow commit),
    so it is logged a little later than it was read; the bot's turn outlasts the deadline.
    The reconnect is due at the deadline minus the margin counted from when the goAway was
    read: the log's own deadline, counted from its record time, was later than Gemini's,
    the timer found it "not near" yet, and nothing looked again before Gemini closed the
    session on the bot mid-sentence."""
    scripts = [
        Script([Audio(chunks=2), TurnComplete(), Audio(chunks=5), WaitSignal("go"),
                GoAway(time_left=2.0), Audio(chunks=75), TurnComplete()], reply=()),
        Script([Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.tap.speaking, timeout=5)
        driver = getattr(ctl.llm, "driver", None)
        if driver is None:  # stock
            ctl.server.signal("go")
        else:
            async with driver._lock:  # noqa: SLF001 - a commit in flight when goAway comes
                ctl.server.signal("go")
                await asyncio.sleep(0.3)
        await ctl.wait(lambda: ctl.script_done(1) and not ctl.tap.speaking, timeout=10)
        await ctl.settle()

    run = await run_call(flavour, scripts, drive, policy=Policy(go_away_margin_s=1.0))

    first = run.connections[0]
    go_away_at = next(s.at for s in first.sent if "goAway" in s.message)
    assert len(run.connections) == 2
    assert first.closed_by == "client", (
        f"Gemini closed the session at its deadline ({first.close_code}), "
        f"{first.closed_at - go_away_at:.2f}s after the goAway")
    assert first.closed_at < go_away_at + 2.0
    assert run.connections[1].resumption_handle == handles_of(run.server, 0)[-1]
    assert_server_clean(run)
    if flavour.durable:
        assert run.find("connection.disconnected", generation=1)[0].data["reason"] == "go_away"
        assert_log_settled(run)


@pytest.mark.parametrize("value, seconds", [
    ("3s", 3.0), ("1.5s", 1.5), (" 0.25s ", 0.25), (".5s", 0.5), ("10", 10.0),
    (7, 7.0), (2.5, 2.5), (datetime.timedelta(seconds=2, milliseconds=500), 2.5),
    # Unreadable: no time left (reconnect at the next chance rather than too late).
    (None, 0.0), ("soon", 0.0), ("-3s", 0.0), ("", 0.0)])
def test_go_away_time_left_as_the_sdk_hands_it_over(value, seconds):
    """google-genai keeps goAway.timeLeft as the protobuf Duration string ("3s", "1.5s"):
    a fraction must not read as "no time left" (nor an integer as a fraction)."""
    assert parse_time_left(value) == pytest.approx(seconds)
