"""examples/phone_bot/playback.py through a pipecat pipeline (pipecat's run_test): a mark per
100 ms of bot audio, in order with the audio; what the echoes say was heard; the echoes of a
cleared turn not counted."""

from __future__ import annotations

from pipecat.frames.frames import (InterruptionFrame, OutputAudioRawFrame,
                                   OutputTransportMessageFrame, TTSStoppedFrame)
from pipecat.tests.utils import run_test

from examples.phone_bot.playback import PlaybackMarks


def audio(ms: int) -> OutputAudioRawFrame:
    return OutputAudioRawFrame(b"\0\0" * (24 * ms), sample_rate=24000, num_channels=1)


def marks_of(frames) -> list[str]:
    return [f.message["mark"]["name"] for f in frames
            if isinstance(f, OutputTransportMessageFrame)]


async def test_a_mark_follows_each_100_ms_of_audio_and_ends_the_turn():
    marks = PlaybackMarks("MZ1")
    down, _ = await run_test(marks, frames_to_send=[audio(40)] * 6 + [TTSStoppedFrame()])
    names = marks_of(down)
    assert names == ["bot-audio:0:120", "bot-audio:0:240"]
    # In order: each mark right after the audio it stands behind.
    kinds = [type(f).__name__ for f in down if not isinstance(f, TTSStoppedFrame)]
    assert kinds[:4] == ["OutputAudioRawFrame"] * 3 + ["OutputTransportMessageFrame"]
    assert all(f.message["streamSid"] == "MZ1" for f in down
               if isinstance(f, OutputTransportMessageFrame))


async def test_the_heard_part_comes_from_the_echoes_of_the_current_turn_only():
    marks = PlaybackMarks("MZ1")
    down, _ = await run_test(marks, frames_to_send=[audio(100)] * 4, send_end_frame=True)
    assert marks_of(down) == [f"bot-audio:0:{ms}" for ms in (100, 200, 300, 400)]
    assert marks.heard_fraction() == 0.0
    marks.played("bot-audio:0:100")
    assert 0.25 <= marks.heard_fraction() <= 0.5  # past the echo, up to the next mark
    marks.played("someone-else:0:300")  # not ours
    marks.played("bot-audio:0:bogus")
    assert marks.heard_fraction() <= 0.5
    # A clear starts a new turn: the old turn's marks, returned after it, count for nothing.
    await run_test(marks, frames_to_send=[InterruptionFrame()])
    assert marks.heard_fraction() is None
    marks.played("bot-audio:0:400")
    assert marks.heard_fraction() is None


async def test_a_finished_turn_is_followed_until_its_last_mark_comes_back():
    """TTSStoppedFrame reaches the marks when the model finishes, long before its audio has
    played: the turn is kept, so a caller talking over the rest can be told apart."""
    marks = PlaybackMarks("MZ1")
    down, _ = await run_test(marks, frames_to_send=[audio(100)] * 4 + [TTSStoppedFrame()],
                             send_end_frame=True)
    assert marks_of(down) == [f"bot-audio:0:{ms}" for ms in (100, 200, 300, 400)]
    assert marks.heard_fraction() is None  # the current turn (the next one) has no audio
    assert marks.finished_turn_heard() == 0.0 and marks.playing()
    marks.played("bot-audio:0:200")
    assert 0.5 <= marks.finished_turn_heard() <= 0.75
    marks.played("bot-audio:0:400")  # played in full: nothing left to talk over
    assert marks.finished_turn_heard() is None and not marks.playing()


async def test_an_interruption_forgets_the_finished_turn():
    marks = PlaybackMarks("MZ1")
    await run_test(marks, frames_to_send=[audio(100)] * 2 + [TTSStoppedFrame()])
    assert marks.finished_turn_heard() == 0.0
    await run_test(marks, frames_to_send=[InterruptionFrame()])  # (a system frame: first)
    assert marks.finished_turn_heard() is None and not marks.playing()
    marks.played("bot-audio:0:100")  # the clear returns its marks: not counted
    assert marks.finished_turn_heard() is None
