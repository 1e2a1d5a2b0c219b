"""Barge-in on the phone (issue #32, item 6), with real parts: the phone bot's app in a uvicorn
worker process, the Twilio stand-in as the caller (it plays the bot's audio in real time and
echoes `mark`s once the audio before them has played), the local Gemini Live server, and
the log on SQLite and PostgreSQL.

While the model generates: the bot says a 30-word sentence (3 s of audio, sent at once as
Gemini does); one second in, the caller talks over it and the model (here the test, as
Gemini's voice detection) sends `interrupted`. After the model finished the sentence: the
caller talks over its audio still playing, with a synthetic voice the worker's voice
detector hears. Either way the caller must get a `clear`, the log must record the
interruption and the bot's turn as far as the caller heard it; and after the call moves to a
new stream (a takeover), the new Gemini session must be seeded with the heard part only."""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from examples.phone_bot.fleet import PUBLIC_URL, ROOT, _start_workers, _stop_workers
from examples.phone_bot.telephony import Balancer, PhoneCall
from rig.crash.harness import Databases
from service.local_live import (Audio, InputTranscript, Interrupted, LocalLiveServer,
                                OutputTranscript, Script, Sleep, TurnComplete, WaitFor,
                                WaitSignal)
from session_store.heard import CUT_MARK
from session_store import Policy, load_state, open_store
from session_store.audit.replay import logged_decisions, replay

pytestmark = pytest.mark.timeout(180)

WORDS = [f"word{i}" for i in range(1, 31)]
SENTENCE_S = 3.0  # 75 chunks of 40 ms
SPEAK_OVER_AFTER_S = 1.0


def script(conn) -> Script:
    if conn.index == 0:  # the call's first session: the sentence the caller talks over
        return Script([WaitFor("client_content", timeout=20, required=False),
                       Audio(chunks=round(SENTENCE_S / 0.04), chunk_ms=40),
                       OutputTranscript(" ".join(WORDS)),
                       WaitSignal("barge", timeout=30), Interrupted(), Sleep(0.2),
                       Audio(chunks=10, chunk_ms=40), OutputTranscript("Sorry, go ahead."),
                       TurnComplete()], reply=(),
                      # A handle after the cut turn: the takeover below passes it over
                      # (it holds the whole sentence) for a fresh session, seeded from the log.
                      resumption_after_turn=True)
    return Script([WaitFor("client_content", timeout=20, required=False)], reply=())


async def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _records(store, call_sid: str, kind: str) -> list:
    return [r for r in await store.read(call_sid) if r.type == kind]


@dataclass
class PhoneBot:
    """One phone bot worker on a database, its Gemini, and what a caller needs."""

    gemini: LocalLiveServer
    store: Any
    balancer: Balancer
    token: str
    http: httpx.AsyncClient

    def caller(self, **options) -> PhoneCall:
        return PhoneCall(self.balancer, f"{PUBLIC_URL}/twiml", "+15550001234",
                         auth_token=self.token, **options)


@asynccontextmanager
async def phone_bot(db: str, tmp_path, script_of, model: str | None = None
                    ) -> AsyncIterator[PhoneBot]:
    databases = Databases(db, tmp_path)
    url, schema = await databases()
    token = uuid.uuid4().hex
    try:
        async with LocalLiveServer(script_of) as gemini:
            env = {**os.environ, "DATABASE_URL": url, "DATABASE_SCHEMA": schema or "",
                   "PUBLIC_URL": PUBLIC_URL, "TWILIO_AUTH_TOKEN": token,
                   "GEMINI_BASE_URL": gemini.base_url, "GEMINI_CA_CERT": str(gemini.cert_path),
                   "TOOL_LEDGER": str(tmp_path / "ledger.jsonl"),
                   **({"GEMINI_MODEL": model} if model else {}),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                               os.environ.get("PYTHONPATH")]))}
            workers = await _start_workers(1, env, tmp_path)
            store = await open_store(url, **({"schema": schema} if schema else {}))
            try:
                balancer = Balancer(PUBLIC_URL, [w.url for w in workers])
                async with httpx.AsyncClient(timeout=10) as http:
                    yield PhoneBot(gemini, store, balancer, token, http)
            finally:
                await store.close()
                await _stop_workers(workers)
    finally:
        await databases.cleanup()


async def _first_cut(bot: PhoneBot, call_sid: str) -> str:
    deadline = time.monotonic() + 10
    while not (cuts := await _records(bot.store, call_sid, "conversation.message_cut")):
        assert time.monotonic() < deadline, "no cut logged"
        await asyncio.sleep(0.1)
    assert len(cuts) == 1, [r.data for r in cuts]
    return cuts[0].data["text"]


async def _seed_after_takeover(bot: PhoneBot, caller: PhoneCall, running: asyncio.Task) -> str:
    """The call moves to a new stream (its first one drops without `stop`): what the new
    Gemini session is seeded with."""
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    moved = asyncio.create_task(bot.caller(call_sid=caller.call_sid).run(bot.http))
    try:
        gemini = bot.gemini
        await gemini.wait_until(lambda: len(gemini.connections) > 1 and bool(
            gemini.connections[1].messages("client_content")), timeout=40)
        return str([m.body for m in gemini.connections[1].messages("client_content")])
    finally:
        moved.cancel()
        await asyncio.gather(moved, return_exceptions=True)


def _replayed_in_full(records) -> list:
    """The call's logged decisions, once today's code decided every one the same."""
    report = replay(records, Policy())
    decisions = list(logged_decisions(records))
    n = len(decisions)
    assert report.ok and report.coverage == f"{n} of {n} decisions replayed", report.to_json()
    return decisions


def _holds_only(seed: str, kept: list[str], words: list[str] = WORDS) -> None:
    assert " ".join(kept) in seed, seed
    unheard = words[len(kept):]
    assert not [w for w in unheard if re.search(rf"\b{w}\b", seed)], seed


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_caller_who_talks_over_the_bot_stops_it_and_the_log_keeps_what_they_heard(
        db, tmp_path):
    async with phone_bot(db, tmp_path, script) as bot:
        caller = bot.caller(speak_over_after_s=SPEAK_OVER_AFTER_S, speech_s=1.0)
        running = asyncio.create_task(caller.run(bot.http))
        await _until(lambda: caller.spoke_over_at is not None or running.done(),
                     40, "the caller to talk over the bot")
        assert caller.spoke_over_at is not None, caller.error
        bot.gemini.signal("barge")  # Gemini's voice detection hears the caller
        stream = caller.streams[-1]
        await _until(lambda: stream.clears > 0, 10, "a clear")
        heard = await _first_cut(bot, caller.call_sid)

        # The caller's side: marks came back as the audio played, then a clear.
        assert stream.clears == 1 and stream.marks, (stream.clears, stream.marks)
        heard_s = stream.cleared_at[0] - stream.first_audio_at
        assert SPEAK_OVER_AFTER_S - 0.1 < heard_s < SENTENCE_S - 0.5, heard_s
        # The log: the interruption, the turn as said, then as far as heard.
        assert await _records(bot.store, caller.call_sid, "speech.interrupted")
        said = [r.data["text"] for r in await _records(
            bot.store, caller.call_sid, "conversation.message") if r.data["role"] == "assistant"]
        assert said[0] == " ".join(WORDS), said
        assert heard.endswith(CUT_MARK), heard
        kept = heard.removesuffix(CUT_MARK).split()
        assert kept == WORDS[:len(kept)], heard
        # The bot knows the position from the newest mark echoed when Gemini said
        # `interrupted`; the caller goes on hearing until the clear reaches it. So the log
        # may keep a little less than was heard (more when a loaded machine delays the
        # echoes), never more than a mark's step (1 word).
        expected = len(WORDS) * heard_s / SENTENCE_S
        assert expected - 6 <= len(kept) <= expected + 1.5, (kept, heard_s)
        # The cut is decided on the log, on the playback fraction the service observed with
        # the transcript (TranscriptFlushed), and replay decides it again.
        records = await bot.store.read(caller.call_sid)
        flushed = [d for d in _replayed_in_full(records) if d.kind == "TranscriptFlushed"
                   and any(r.type == "conversation.message_cut" for r in d.events)]
        assert len(flushed) == 1 and 0 < flushed[0].observation.heard_fraction < 1, flushed

        # After a takeover the new session is seeded with what the caller heard, not the rest.
        seed = await _seed_after_takeover(bot, caller, running)
        _holds_only(seed, kept)
        print(f"\n{db}: heard {heard_s:.2f} s of {SENTENCE_S} s, {len(stream.marks)} marks "
              f"echoed; logged {len(kept)} of {len(WORDS)} words (expected {expected:.1f}); "
              f"seed: {seed[:300]}")


# ---------------------------------------------------------------- after the model's turn

#: From the caller's first syllable to the `clear`: Silero needs ~0.36 s of this voice
#: (its 0.2 s start and the loudness window), the VAD takes 0.1 s batches, then the
#: interruption crosses the pipeline. Measured 0.45 s at load 7, 1.6 s at load 25 (2 cores).
CLEAR_WITHIN_S = 2.0
#: A longer answer here: under load the voice is heard late, and the audio must still play.
LONG_WORDS = [f"word{i}" for i in range(1, 61)]
LONG_SENTENCE_S = 6.0


def finished_turn_script(conn) -> Script:
    if conn.index == 0:  # the model says the whole sentence and is done: only playback is left
        return Script([WaitFor("client_content", timeout=20, required=False),
                       Audio(chunks=round(LONG_SENTENCE_S / 0.04), chunk_ms=40),
                       OutputTranscript(" ".join(LONG_WORDS)), TurnComplete()], reply=(),
                      # Its handle after the turn holds it whole: the takeover below
                      # passes it over for a fresh session, seeded from the log.
                      resumption_after_turn=True)
    return Script([WaitFor("client_content", timeout=20, required=False)], reply=())


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_caller_who_talks_over_the_bot_after_the_model_finished_stops_its_audio(
        db, tmp_path):
    """Gemini has no generation left to interrupt: the worker's voice detector hears the
    caller over the bot's audio, stops it (`clear`), logs the interruption and cuts the bot's
    logged message to what was heard, and a session seeded after a takeover holds only that."""
    async with phone_bot(db, tmp_path, finished_turn_script) as bot:
        caller = bot.caller(speak_over_after_s=SPEAK_OVER_AFTER_S, speech_s=1.0, voice=True)
        running = asyncio.create_task(caller.run(bot.http))
        await _until(lambda: caller.spoke_over_at is not None or running.done(),
                     40, "the caller to talk over the bot")
        assert caller.spoke_over_at is not None, caller.error
        stream = caller.streams[-1]
        await _until(lambda: stream.clears > 0, 10, "a clear")

        # The caller's side: the bot's audio stopped soon after they spoke up.
        cleared_at = stream.cleared_at[0]
        reaction_s = cleared_at - caller.spoke_over_at
        assert 0 < reaction_s < CLEAR_WITHIN_S, reaction_s
        await asyncio.sleep(0.5)
        assert stream.clears == 1, stream.clears
        late = [at - cleared_at for at, _ in stream.media if at > cleared_at + 0.05]
        assert not late, f"bot audio after the clear: {late[:5]}"
        heard_s = cleared_at - stream.first_audio_at
        assert SPEAK_OVER_AFTER_S < heard_s < LONG_SENTENCE_S - 0.5, heard_s

        # The log: the turn logged whole at turnComplete, then the interruption and the cut
        # to what the caller heard.
        heard = await _first_cut(bot, caller.call_sid)
        records = await bot.store.read(caller.call_sid)
        said = [r for r in records
                if r.type == "conversation.message" and r.data["role"] == "assistant"]
        assert [r.data["text"] for r in said] == [" ".join(LONG_WORDS)]
        interrupted = next(r.version for r in records if r.type == "speech.interrupted")
        cut = next(r.version for r in records if r.type == "conversation.message_cut")
        assert said[0].version < interrupted < cut
        assert heard.endswith(CUT_MARK), heard
        kept = heard.removesuffix(CUT_MARK).split()
        assert kept == LONG_WORDS[:len(kept)], heard
        # The position is the newest mark echoed when the interruption crossed the service;
        # the caller heard on until the clear reached them.
        expected = len(LONG_WORDS) * heard_s / LONG_SENTENCE_S
        assert expected - 6 <= len(kept) <= expected + 1.5, (kept, heard_s)
        assert (await load_state(bot.store, caller.call_sid)).conversation[-1] == (
            "assistant", heard)
        # Decided on the log: the local barge-in observed with the finished turn's playback
        # fraction, the message to cut the fold's; replay decides it again.
        barge_in = [d for d in _replayed_in_full(records)
                    if any(r.version == cut for r in d.events)]
        assert [d.kind for d in barge_in] == ["InterruptionObserved"], barge_in
        assert barge_in[0].observation.local, barge_in[0].observation

        # A takeover seeds a fresh session with what the caller heard only.
        _holds_only(await _seed_after_takeover(bot, caller, running), kept, LONG_WORDS)
        print(f"\n{db}: spoke {SPEAK_OVER_AFTER_S} s into the bot's audio, clear "
              f"{reaction_s:.2f} s later; heard {heard_s:.2f} s of {LONG_SENTENCE_S} s; "
              f"logged {len(kept)} of {len(LONG_WORDS)} words (expected {expected:.1f})")


# ---------------------------------------------------------------- the live session is told

GENERATIONS = {
    "2.5": "models/gemini-2.5-flash-native-audio-preview",
    "3.8": "models/gemini-3.8-live",
}
#: Where no note can tell the live session (session_store/cut_notes.py): it is replaced.
RESEEDED = {
    "3.1": "models/gemini-3.1-flash-live-preview",
    "3.8-thinking": "models/gemini-3.8-live-extended-thinking",
}


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
@pytest.mark.parametrize("generation", list(GENERATIONS))
async def test_the_live_session_that_said_the_cut_turn_is_told_what_the_caller_heard(
        generation, db, tmp_path):
    """After the cut, the Gemini session that said the turn holds a note with the heard part
    (2.5 and 3.8: clientContent, turnComplete false, so no reply is asked for)."""
    async with phone_bot(db, tmp_path, finished_turn_script, GENERATIONS[generation]) as bot:
        caller = bot.caller(speak_over_after_s=SPEAK_OVER_AFTER_S, speech_s=1.0, voice=True)
        running = asyncio.create_task(caller.run(bot.http))
        try:
            await _until(lambda: caller.spoke_over_at is not None or running.done(),
                         40, "the caller to talk over the bot")
            assert caller.spoke_over_at is not None, caller.error
            heard = await _first_cut(bot, caller.call_sid)
            kept = heard.removesuffix(CUT_MARK).split()
            assert kept == LONG_WORDS[:len(kept)] and len(kept) < len(LONG_WORDS), heard
            kinds = "conversation.cut_told"
            deadline = time.monotonic() + 10
            while not (outcome := await _records(bot.store, caller.call_sid, kinds)):
                assert time.monotonic() < deadline, f"no {kinds} logged"
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # (anything sent twice would be on the wire by now)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        records = await bot.store.read(caller.call_sid)
        cut = next(r.version for r in records if r.type == "conversation.message_cut")
        # Today's code decides the note again from the log, and every decision replays.
        _replayed_in_full(records)
        said = bot.gemini.connections[0]
        notes = [m.body for m in said.messages("client_content")
                 if m.at > (said.model_output_at or 0)]
        assert not [v for v in bot.gemini.violations if v["connection"] == 0], \
            bot.gemini.violations
        telling = [r for r in records if r.type == "conversation.cut_telling"]
        assert [r.data for r in telling] == [{"generation": 1, "cut": cut, "via": "content"}]
        assert [r.data for r in outcome] == [{"generation": 1, "cut": cut, "via": "content"}]
        assert telling[0].version < outcome[0].version
        # The wire: one note, asking for no reply, holding the heard words and not the rest.
        assert len(notes) == 1 and not notes[0].get("turn_complete"), notes
        _holds_only(str(notes[0]), kept, LONG_WORDS)
        # The model state of the live session holds it (the scripted model's context).
        held = [e.text for e in said.state.conversation if e.how == "content"]
        assert any(" ".join(kept) in text for text in held), held
        after_ms = (outcome[0].recorded_at_us - next(
            r.recorded_at_us for r in records if r.version == cut)) / 1000
        print(f"\n{generation} {db}: told {len(kept)} of {len(LONG_WORDS)} words, logged "
              f"sent {after_ms:.0f} ms after the cut: {notes[0]}")


#: One 20 ms frame of the caller's audio as the worker sends it (16 kHz PCM).
LIVE_FRAME_BYTES = 640


def _audio_bytes(message) -> int:
    """The audio a realtimeInput message carried (the server records its size)."""
    data = ((message.body or {}).get("audio") or {}).get("data") if isinstance(
        message.body, dict) else None
    match = re.fullmatch(r"<(\d+) bytes>", data or "")
    return int(match.group(1)) if match else 0


#: The caller's words a session heard before it was replaced: late words of their question
#: (kept, logged once the next flush comes), and the barge-in's (its audio goes again).
LATE = "please refund order seven"
AFTER = "no wait order eight"


def reseed_script(variant: str, generation: str):
    """`generating`: Gemini hears the caller over its sentence (`interrupted`) and
    transcribes them; on 3.8 thinking it answers them (IN_PROGRESS until then) before it is
    idle. `finished`: the model is done, its audio plays, the worker's voice detector hears
    the caller (on 3.1 after the question's words came late; on 3.8 thinking the local
    server counts late words as a turn under way, which no local barge-in cuts into). The
    session that replaces it answers once seeded."""
    thinking = generation == "3.8-thinking"

    def script_of(conn) -> Script:
        if conn.index == 0 and variant == "generating":
            answer = ([Audio(chunks=5), OutputTranscript("Sorry, go ahead."), TurnComplete()]
                      if thinking else [Sleep(10)])
            return Script([WaitFor("client_content", timeout=20, required=False),
                           Audio(chunks=round(SENTENCE_S / 0.04), chunk_ms=40),
                           OutputTranscript(" ".join(WORDS)),
                           WaitSignal("barge", timeout=30), Interrupted(),
                           InputTranscript(AFTER), *answer], reply=())
        if conn.index == 0:
            return Script([WaitFor("client_content", timeout=20, required=False),
                           Audio(chunks=round(LONG_SENTENCE_S / 0.04), chunk_ms=40),
                           OutputTranscript(" ".join(LONG_WORDS)), TurnComplete(),
                           *([] if thinking else [InputTranscript(LATE)])], reply=(),
                          resumption_after_turn=True)
        return Script([WaitFor("client_content", timeout=20, required=False), Sleep(1.0),
                       Audio(chunks=5), OutputTranscript("Go on."), TurnComplete()],
                      reply=())
    return script_of


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
@pytest.mark.parametrize("variant", ["generating", "finished"])
@pytest.mark.parametrize("generation", list(RESEEDED))
async def test_where_no_note_can_tell_it_the_session_that_said_the_cut_turn_is_replaced(
        generation, variant, db, tmp_path):
    """3.1 refuses clientContent after its first turn (1007) and answers realtimeInput.text
    as the caller; 3.8 thinking documents no mid-session note. The session that said the cut
    turn is replaced, while the caller is still talking, by a fresh one seeded with the
    heard part only; the caller's audio from before the cut, and from the handshake, goes
    to the new session, so it hears them from their first word (and transcribes it: the
    old session's words for it are not logged)."""
    words = WORDS if variant == "generating" else LONG_WORDS
    # 3.8 thinking is idle only once it answered the caller: replaced then, with nothing
    # to send again (that session heard them and answered).
    answered_first = generation == "3.8-thinking" and variant == "generating"
    async with phone_bot(db, tmp_path, reseed_script(variant, generation),
                         RESEEDED[generation]) as bot:
        caller = bot.caller(speak_over_after_s=SPEAK_OVER_AFTER_S, speech_s=1.0,
                            voice=variant == "finished")
        running = asyncio.create_task(caller.run(bot.http))
        gemini = bot.gemini
        try:
            await _until(lambda: caller.spoke_over_at is not None or running.done(),
                         40, "the caller to talk over the bot")
            assert caller.spoke_over_at is not None, caller.error
            if variant == "generating":
                gemini.signal("barge")  # Gemini's voice detection hears the caller
            heard = await _first_cut(bot, caller.call_sid)
            kept = heard.removesuffix(CUT_MARK).split()
            assert kept == words[:len(kept)] and len(kept) < len(words), heard
            await gemini.wait_until(lambda: len(gemini.connections) > 1 and bool(
                gemini.connections[1].messages("client_content")), timeout=20)
            deadline = time.monotonic() + 10  # the new session's answer ends its turn
            while not [r for r in await _records(bot.store, caller.call_sid,
                                                 "conversation.message")
                       if r.data["text"] == "Go on."]:
                assert time.monotonic() < deadline, "the new session's answer was not logged"
                await asyncio.sleep(0.1)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        records = await bot.store.read(caller.call_sid)
        _replayed_in_full(records)

        # The log: the cut, the decision to replace the session for it, the new session.
        cut = next(r.version for r in records if r.type == "conversation.message_cut")
        telling = [r for r in records if r.type == "conversation.cut_telling"]
        assert [r.data for r in telling] == [{"generation": 1, "cut": cut, "via": "reseed"}]
        requested = [r for r in records if r.type == "connection.reconnect_requested"]
        assert [(r.version, r.data["reason"]) for r in requested] == [
            (telling[0].version + 1, "cut_turn")]
        left = [r.data for r in records if r.type == "connection.disconnected"]
        assert left[0]["generation"] == 1 and left[0]["reason"] == "cut_turn", left
        connected = [r.data for r in records if r.type == "connection.connected"]
        assert [(c["generation"], c["handle"]) for c in connected[:2]] == [(1, None), (2, None)]
        assert not [r for r in records if r.type == "conversation.cut_untold"]
        # The caller's words: the old session's for the audio sent again are not logged (the
        # new session transcribes it); those of a session that answered them are, as a
        # question's late words, once.
        users = " ".join(r.data["text"] for r in records if r.type == "conversation.message"
                         and r.data["role"] == "user")
        assert users.count(AFTER) == (1 if answered_first else 0), users
        if variant == "finished" and generation == "3.1":
            assert users.count(LATE) == 1, users

        # The wire: the old session was sent nothing it refuses or answers as the caller; the
        # new one is fresh, seeded with the heard words only, and hears the caller after it.
        said, fresh = gemini.connections[0], gemini.connections[1]
        assert not gemini.violations, gemini.violations
        assert said.close_code != 1007 and said.closed_by == "client"
        notes = [m for m in said.messages("client_content")
                 if m.at > (said.model_output_at or 0)]
        texts = [m.body.get("text") for m in said.messages("realtime_input")
                 if isinstance(m.body, dict) and str(m.body.get("text") or "").strip()]
        assert notes == [] and texts == [], (notes, texts)
        assert fresh.resumed_from is None
        seeds = fresh.messages("client_content")
        _holds_only(str([m.body for m in seeds]), kept, words)
        audio = [m for m in fresh.messages("realtime_input") if _audio_bytes(m)]
        assert audio and audio[0].index > seeds[0].index
        # Its first audio is what the caller said while no session was there (about as
        # long as from the old session's close to this) and, before it, what the old
        # session had been sent from a second before the interruption, if it had not
        # answered them: sent as held chunks, each larger than one live 20 ms frame (the
        # last may not be: left out, at most one 0.2 s chunk). Sizes, not arrival times:
        # a loaded worker spreads the chunks out.
        sizes = [_audio_bytes(m) for m in audio]
        live = next((i for i, size in enumerate(sizes) if size <= LIVE_FRAME_BYTES), len(sizes))
        burst_s = sum(sizes[:live]) / 32000
        between_s = audio[0].at - said.closed_at
        if answered_first:
            assert burst_s - between_s < 0.3, (burst_s, between_s)
        else:
            assert burst_s - between_s >= 0.8, (burst_s, between_s)
        print(f"\n{generation} {variant} {db}: kept {len(kept)} of {len(words)} words; the "
              f"new session got {burst_s:.2f} s of the caller's audio in held chunks after its "
              f"seed, {between_s:.2f} s after the old one closed")
