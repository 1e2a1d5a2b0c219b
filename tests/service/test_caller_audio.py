"""What the caller says between two Gemini sessions reaches the next one (service/caller_audio.py).

The caller's microphone never stops: during a reconnect's handshake (here held 0.6 s by the
server) pipecat has no session to send it to and drops it. The service holds it and sends it
to the next session first. Each 20 ms frame carries its own number, so the server's record
says whether every frame arrived, once, in order, and on which connection.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time

import pytest
from pipecat.frames.frames import InputAudioRawFrame

from service.caller_audio import RELEASE_CHUNK_S, CallerAudioHold
from service.local_live import Audio, GoAway, Script, Sleep, TurnComplete, WaitSignal
from session_store import Policy

from .helpers import Ctl, assert_log_settled, assert_server_clean, run_call

pytestmark = pytest.mark.timeout(90)

FRAME_BYTES = 640  # 20 ms of 16 kHz mono PCM16
HANDSHAKE_S = 0.6


def numbered(i: int, rate: int = 16000) -> InputAudioRawFrame:
    """A 20 ms frame whose every sample pair spells `i`."""
    return InputAudioRawFrame(audio=struct.pack("<I", i) * (rate // 50 // 2), sample_rate=rate,
                              num_channels=1)


def frames_in(connection) -> list[int]:
    """The numbers of the frames a connection received, in order (chunks split back)."""
    out = []
    for message in connection.messages("realtime_input"):
        body = message.body if isinstance(message.body, dict) else {}
        blob = body.get("audio") or {}
        if not blob.get("data"):
            continue
        data = blob["data"]
        audio = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
        assert len(audio) % FRAME_BYTES == 0, len(audio)
        for at in range(0, len(audio), FRAME_BYTES):
            frame = audio[at:at + FRAME_BYTES]
            assert frame == frame[:4] * (FRAME_BYTES // 4), "a frame arrived mixed"
            out.append(struct.unpack("<I", frame[:4])[0])
    return out


@pytest.mark.stock_bug("the caller's audio is dropped while no session is ready")
async def test_what_the_caller_says_during_a_reconnect_reaches_the_next_session(flavour):
    scripts = [Script([Audio(chunks=2), TurnComplete(), WaitSignal("go", timeout=20),
                       GoAway(time_left=5.0), Sleep(10)], reply=()),
               Script([Sleep(10)], reply=(), setup_delay=HANDSHAKE_S)]
    sent: list[int] = []
    between: list[int] = []  # sent while no session could take them

    async def drive(ctl: Ctl):
        llm = ctl.llm

        def ready() -> bool:
            return llm._session is not None and llm._ready_for_realtime_input  # noqa: SLF001

        async def microphone():
            # Paced by the clock, as a transport delivers audio: a late frame is caught up
            # at once, so a loaded machine sends the same audio per second.
            next_at = time.monotonic()
            while True:
                if not ready():
                    between.append(len(sent))
                sent.append(len(sent))
                await ctl.task.queue_frame(numbered(sent[-1]))
                next_at += 0.02
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        assert await ctl.wait(lambda: ready() and ctl.script_done(0) is False
                              and bool(ctl.tap.speech) and not ctl.tap.speaking, timeout=10)
        mic = asyncio.create_task(microphone())
        try:
            await asyncio.sleep(0.3)
            ctl.server.signal("go")
            assert await ctl.wait(lambda: len(ctl.server.connections) == 2 and ready(),
                                  timeout=10), "no second session"
            await asyncio.sleep(0.4)
        finally:
            mic.cancel()
            await asyncio.gather(mic, return_exceptions=True)
        await ctl.settle(0.3)
        hold.append(getattr(llm, "caller_audio", None))

    hold: list[CallerAudioHold | None] = []
    run = await run_call(flavour, scripts, drive, keep_audio=True,
                         policy=Policy(go_away_margin_s=1.0))

    first, second = (frames_in(c) for c in run.connections[:2])
    # The handshake alone held 0.6 s: the caller said that much while no session was ready.
    assert len(between) >= HANDSHAKE_S / 0.02 * 0.8, (len(between), sent)
    assert first + second == sent, (first, second, between)
    assert set(between) <= set(second)
    assert len(run.connections) == 2
    assert_server_clean(run)
    if flavour.durable:
        assert hold[0].dropped_s == 0
        # (`between` is the test's view when it queued each frame; a frame queued just
        # before the session was ready can reach the service after: sent, not held.)
        assert hold[0].released_s >= HANDSHAKE_S * 0.8, hold[0].released_s
        assert_log_settled(run)


# ---------------------------------------------------------------- the hold itself (unit)

def test_the_newest_seconds_are_kept_and_the_drop_is_counted():
    hold = CallerAudioHold(limit_s=0.1)
    for i in range(8):  # 160 ms into a 100 ms hold
        hold.hold(numbered(i))
    assert hold.held_s == pytest.approx(0.1)
    assert hold.dropped_s == pytest.approx(0.06)
    chunks = hold.release()
    audio = b"".join(c.audio for c in chunks)
    assert [struct.unpack("<I", audio[i:i + 4])[0] for i in range(0, len(audio), FRAME_BYTES)] \
        == [3, 4, 5, 6, 7]
    assert hold.held_s == 0 and hold.release() == []


def test_release_joins_frames_into_chunks_of_one_format():
    hold = CallerAudioHold(limit_s=5.0)
    frames = [numbered(i) for i in range(25)] + [numbered(99, rate=8000)] + [numbered(26)]
    for f in frames:
        hold.hold(f)
    chunks = hold.release()
    assert [(c.sample_rate, len(c.audio)) for c in chunks] == [
        (16000, 10 * FRAME_BYTES), (16000, 10 * FRAME_BYTES), (16000, 5 * FRAME_BYTES),
        (8000, FRAME_BYTES // 2), (16000, FRAME_BYTES)]
    assert all(len(c.audio) / 32000 <= RELEASE_CHUNK_S + 1e-9 for c in chunks)
    assert b"".join(c.audio for c in chunks) == b"".join(f.audio for f in frames)


def test_discard_empties_the_hold():
    hold = CallerAudioHold(limit_s=1.0)
    hold.hold(numbered(1))
    hold.discard()
    assert hold.release() == [] and hold.held_s == 0


def _numbers(chunks) -> list[int]:
    audio = b"".join(c.audio for c in chunks)
    return [struct.unpack("<I", audio[i:i + 4])[0] for i in range(0, len(audio), FRAME_BYTES)]


def test_a_replay_sends_again_what_the_old_session_heard_since_before_the_interruption(
        monkeypatch):
    """From REPLAY_LEAD_S before the interruption, ahead of what was held since; once."""
    clock = [100.0]
    monkeypatch.setattr("service.caller_audio.time.monotonic", lambda: clock[0])
    hold = CallerAudioHold(limit_s=5.0)
    for i in range(100):  # 2 s sent to the live session, one frame every 20 ms
        hold.sent(numbered(i))
        clock[0] += 0.02
    hold.caller_interrupted()  # at 102.0: frames from 101.0 on (50..99) go again
    since = hold.interrupted_at
    for i in range(100, 105):  # held while the new session connects
        hold.hold(numbered(i))
    assert hold.replay_since(since)
    assert _numbers(hold.release()) == list(range(50, 105))
    assert hold.replayed_s == pytest.approx(1.0)
    assert hold.interrupted_at is None and not hold.replay_since(None)


@pytest.mark.parametrize("held", [0, 10], ids=["kept-too-little", "held-too-much"])
def test_a_replay_that_cannot_go_whole_says_so(monkeypatch, held):
    """What the hold kept of the old session's audio does not reach back to the window's
    start, or the audio held since pushes part of it out: the caller's words the old
    session transcribed then stay (said twice, not lost)."""
    clock = [100.0]
    monkeypatch.setattr("service.caller_audio.time.monotonic", lambda: clock[0])
    hold = CallerAudioHold(limit_s=0.5 if not held else 1.0)
    for i in range(50):  # 1 s
        hold.sent(numbered(i))
        clock[0] += 0.02
    hold.caller_interrupted()
    since = hold.interrupted_at
    for i in range(50, 50 + held):
        hold.hold(numbered(i))
    assert not hold.replay_since(since)
    replayed = _numbers(hold.release())
    assert replayed == list(range(25 if not held else 10, 50 + held))


def test_no_replay_once_the_old_session_answered():
    hold = CallerAudioHold(limit_s=5.0)
    hold.sent(numbered(1))
    hold.caller_interrupted()
    hold.sent(numbered(2))
    hold.model_responded()  # what the caller said is in its answer
    assert hold.interrupted_at is None
    assert not hold.replay_since(hold.interrupted_at) and hold.release() == []


def test_chunks_the_session_did_not_take_go_first_to_the_next():
    hold = CallerAudioHold(limit_s=5.0)
    for i in range(3):
        hold.hold(numbered(i))
    chunks = hold.release()
    hold.hold(numbered(3))
    hold.hold_again(chunks)
    assert _numbers(hold.release()) == [0, 1, 2, 3]
