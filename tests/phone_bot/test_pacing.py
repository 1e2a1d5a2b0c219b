"""The phone bot's audio pacing (examples/phone_bot/pacing.py): the writes keep a lead over
the caller's playback and make up a late write, where pipecat's restart their clock."""

from __future__ import annotations

import pytest

from examples.phone_bot.pacing import PlayoutClock

CHUNK_S = 0.04


def test_writes_run_ahead_by_the_lead_then_keep_real_time():
    clock = PlayoutClock(lead_s=0.2)
    waits = [clock.wrote(CHUNK_S, now=100.0) for _ in range(5)]
    # 0.04 .. 0.2 s buffered: no wait until more than the lead is at the caller.
    assert waits[:4] == [0.0] * 4
    assert waits[4] == pytest.approx(0.0)
    assert clock.wrote(CHUNK_S, now=100.0) == pytest.approx(CHUNK_S)


def test_a_late_write_is_made_up_not_lost():
    clock = PlayoutClock(lead_s=0.2)
    now = 100.0
    for _ in range(10):  # steady state: 0.2 s ahead
        now += clock.wrote(CHUNK_S, now)
    played_out = clock.played_out_at
    now += 0.15  # the loop was busy: shorter than the lead, the caller hears no gap
    assert played_out > now
    waits = [clock.wrote(CHUNK_S, now) for _ in range(4)]
    # The writes go at once until the lead is back: the caller's clock did not move.
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert clock.played_out_at == pytest.approx(played_out + 4 * CHUNK_S)


def test_the_clock_restarts_when_the_callers_audio_ran_out():
    clock = PlayoutClock(lead_s=0.2)
    clock.wrote(CHUNK_S, now=100.0)
    # A new turn 2 s later (or a block longer than the lead): it plays from now.
    assert clock.wrote(CHUNK_S, now=102.0) == 0.0
    assert clock.played_out_at == pytest.approx(102.0 + CHUNK_S)
    clock.reset()  # an interruption: Twilio dropped what it held
    assert clock.wrote(CHUNK_S, now=102.01) == 0.0
    assert clock.played_out_at == pytest.approx(102.01 + CHUNK_S)


def test_no_lead_paces_to_real_time_and_a_negative_one_is_refused():
    clock = PlayoutClock(lead_s=0.0)
    assert clock.wrote(CHUNK_S, now=5.0) == pytest.approx(CHUNK_S)
    with pytest.raises(ValueError, match="lead_s"):
        PlayoutClock(lead_s=-0.1)


def test_the_lead_is_set_from_the_environment_and_bad_values_are_refused():
    from examples.phone_bot.config import BotConfig
    base = {"DATABASE_URL": "sqlite+aiosqlite:///x.db", "PUBLIC_URL": "https://bot.test",
            "GOOGLE_API_KEY": "k"}
    assert BotConfig.from_env(base).audio_lead_s == 0.2
    assert BotConfig.from_env({**base, "AUDIO_LEAD_S": "0.5"}).audio_lead_s == 0.5
    assert BotConfig.from_env({**base, "AUDIO_LEAD_S": "off"}).audio_lead_s is None
    for bad in ("-1", "soon"):
        with pytest.raises(SystemExit, match="AUDIO_LEAD_S"):
            BotConfig.from_env({**base, "AUDIO_LEAD_S": bad})
