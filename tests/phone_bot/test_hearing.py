"""The fleet's ear (examples/phone_bot/hearing.py) on synthetic phone audio: tones in 20 ms
μ-law frames, timed as a stream receives them. The fleet counts its repeats as violations, so
each verdict here is checked both ways."""

from __future__ import annotations

import base64

import numpy as np
import soxr

from examples.phone_bot.gemini_script import TONES
from examples.phone_bot.hearing import RATE, ULAW, hear, pcm_to_ulaw
from service.local_live import protocol

LENGTHS = {"greeting": 0.4, "refund_order": 0.4, "send_receipt": 0.4, "farewell": 0.4,
           "still_there": 0.4}


def to_ulaw(pcm: np.ndarray) -> bytes:
    """The μ-law byte whose sample is nearest (the inverse of the ear's table)."""
    order = np.argsort(ULAW)
    ranks = np.clip(np.searchsorted(ULAW[order], pcm), 1, 255)
    below, above = order[ranks - 1], order[ranks]
    nearer = np.where(np.abs(ULAW[below] - pcm) <= np.abs(ULAW[above] - pcm), below, above)
    return nearer.astype(np.uint8).tobytes()


class Phone:
    """One stream's received audio: 20 ms frames, each arriving when the one before ends."""

    def __init__(self, at: float = 1000.0):
        self.at, self.audio = at, []

    def say(self, utterance: str | None, seconds: float) -> Phone:
        for _ in range(round(seconds / 0.02)):
            if utterance is None:
                pcm = np.zeros(160)
            else:
                t = (np.arange(160) + round(self.at * RATE)) / RATE
                pcm = 8000 * np.sin(2 * np.pi * TONES[utterance] * t)
            self.audio.append((self.at, to_ulaw(pcm.astype(np.int16))))
            self.at += 0.02
        return self

    def pause(self, seconds: float) -> Phone:  # nothing arrives: the phone runs dry
        self.at += seconds
        return self


def test_the_table_decodes_g711():
    # ITU-T G.711: 0xFF and 0x7F are the two zeros, 0x00 and 0x80 the extremes.
    assert [int(ULAW[b]) for b in (0xFF, 0x7F, 0x00, 0x80)] == [0, 0, -32124, 32124]


def test_a_clean_call_has_no_repeat_restart_or_stall():
    phone = (Phone().say("greeting", 0.4).say(None, 0.5).say("refund_order", 0.4)
             .pause(1.0).say("send_receipt", 0.4).say("farewell", 0.4))
    heard = hear([phone.audio], TONES, LENGTHS)
    assert [r.utterance for r in heard.runs] == ["greeting", "refund_order", "send_receipt",
                                                 "farewell"]
    assert not heard.repeats and not heard.restarts and not heard.stalls
    assert not heard.unfinished
    assert abs(heard.heard_s["greeting"] - 0.4) < 0.03


def test_an_utterance_heard_whole_then_again_after_a_takeover_is_a_repeat():
    first = Phone().say("greeting", 0.4).say("refund_order", 0.4).pause(0.3)
    second = Phone(first.at + 1.0).say("refund_order", 0.4).say("send_receipt", 0.4)
    heard = hear([first.audio, second.audio], TONES, LENGTHS)
    assert len(heard.repeats) == 1 and heard.repeats[0].startswith("refund_order")


def test_a_cut_utterance_said_again_from_the_top_is_a_restart_not_a_repeat():
    first = Phone().say("greeting", 0.4).say("refund_order", 0.2)
    second = Phone(first.at + 1.0).say("refund_order", 0.4)
    heard = hear([first.audio, second.audio], TONES, LENGTHS)
    assert not heard.repeats and len(heard.restarts) == 1
    # Finished after the takeover (the rest of it only): neither.
    second = Phone(first.at + 1.0).say("refund_order", 0.2)
    heard = hear([first.audio, second.audio], TONES, LENGTHS)
    assert not heard.repeats and not heard.restarts
    assert not heard.unfinished


def test_the_rest_of_an_utterance_heard_mostly_is_not_a_repeat():
    first = Phone().say("greeting", 0.32)
    second = Phone(first.at + 1.0).say("greeting", 0.08).say("refund_order", 0.4)
    heard = hear([first.audio, second.audio], TONES, LENGTHS)
    assert not heard.repeats and not heard.restarts and not heard.unfinished
    # From the top again: heard twice.
    second = Phone(first.at + 1.0).say("greeting", 0.4)
    assert len(hear([first.audio, second.audio], TONES, LENGTHS).repeats) == 1


def test_a_cut_utterance_never_said_again_is_unfinished():
    first = Phone().say("greeting", 0.1)
    second = Phone(first.at + 1.0).say("refund_order", 0.4)
    heard = hear([first.audio, second.audio], TONES, LENGTHS)
    assert not heard.repeats and not heard.restarts
    assert [u.split(":")[0] for u in heard.unfinished] == ["greeting"]
    # Said again from the top after the takeover: finished.
    second = Phone(first.at + 1.0).say("greeting", 0.4).say("refund_order", 0.4)
    assert not hear([first.audio, second.audio], TONES, LENGTHS).unfinished


def test_a_silence_inside_an_utterance_is_a_stall():
    phone = Phone().say("greeting", 0.2).pause(0.15).say("greeting", 0.2)
    heard = hear([phone.audio], TONES, LENGTHS)
    assert [s.utterance for s in heard.stalls] == ["greeting"]
    assert abs(heard.stalls[0].seconds - 0.15) < 0.03
    assert heard.stalls[0].dry and abs(heard.stalls[0].late_s - 0.05) < 0.01
    short = Phone().say("greeting", 0.2).pause(0.06).say("greeting", 0.2)
    assert not hear([short.audio], TONES, LENGTHS).stalls
    # Late in the utterance: still a stall, not a repeat (it adds up to its length).
    late = Phone().say("greeting", 0.34).pause(0.3).say("greeting", 0.06)
    heard = hear([late.audio], TONES, LENGTHS)
    assert len(heard.stalls) == 1 and not heard.repeats
    # Said twice on one stream (a session that went back): a repeat.
    twice = Phone().say("greeting", 0.4).pause(0.3).say("greeting", 0.4)
    assert len(hear([twice.audio], TONES, LENGTHS).repeats) == 1


def test_the_local_servers_tone_survives_the_phone_path():
    """24 kHz PCM from the local server, resampled to 8 kHz μ-law as pipecat's Twilio
    serializer does: the tone is still told apart."""
    chunk = protocol.audio_chunk(400, TONES["send_receipt"])
    pcm = base64.b64decode(chunk["serverContent"]["modelTurn"]["parts"][0]["inlineData"]["data"])
    narrow = soxr.resample(np.frombuffer(pcm, dtype="<i2"), 24000, RATE)
    ulaw = to_ulaw(narrow.astype(np.int16))
    frames = [(1000.0 + i * 0.02, ulaw[i * 160:(i + 1) * 160]) for i in range(len(ulaw) // 160)]
    heard = hear([frames], TONES, LENGTHS)
    assert [r.utterance for r in heard.runs] == ["send_receipt"]


def test_the_mu_law_encoder_inverts_the_decoder_and_saturates():
    codes = np.arange(256, dtype=np.uint8)
    samples = ULAW[codes].astype("<i2").tobytes()
    back = np.frombuffer(pcm_to_ulaw(samples), dtype=np.uint8)
    # Every code decodes to a sample that encodes to it again, but μ-law's two zeros
    # (0x7F, 0xFF): silence encodes as 0xFF, Twilio's (and telephony.SILENCE's) zero.
    assert [int(c) for c in codes[back != codes]] == [0x7F]
    assert pcm_to_ulaw(np.array([0, 32767, -32768], dtype="<i2").tobytes()) == b"\xff\x80\x00"
