"""Database outage (issue #6): the database goes away while 100 calls append, and comes back.

- PostgreSQL: a private cluster (tests/faults/pgcluster.py) is stopped (`immediate`: a crash,
  `fast`: an orderly shutdown that cuts every client) and restarted mid-run.
- SQLite: the disk fills up, or the database becomes unwritable, mid-run.

Throughout: every acknowledged append is in the log afterwards, exactly; an append issued
during the outage either succeeds after recovery or fails with StoreUnavailable after its own
bounded wait (never silently); the store recovers without being reopened; versions are
gap-free and every hash chain verifies (tests/faults/load.py, `check_log`). Each test also
asserts that the fault really happened (retries counted, appends that waited it out).

CI runs the short versions; `LONG_FAULTS=1` runs the long ones (several restarts, minutes):

    LONG_FAULTS=1 python -m pytest tests/faults -k long -s
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from loguru import logger
from pipecat.frames.frames import InputAudioRawFrame

from service.local_live import (Audio, Call, Interrupted, Script, Sleep, ToolCall, TurnComplete,
                                WaitSignal, WaitToolResponse)
from tests.service.helpers import (Ctl, Flavour, assert_answered_once, assert_chain_ok,
                                   assert_log_settled, assert_ran_once, assert_server_clean,
                                   run_call, migrated_sqlite)

from .load import Load, check_log
from .netproxy import PartitionProxy
from .pgcluster import Outage
from .sqlitefaults import CannotFault, TinyDisk, Unwritable

LONG = os.environ.get("LONG_FAULTS") == "1"
long_only = pytest.mark.skipif(not LONG, reason="long fault run: set LONG_FAULTS=1")

pytestmark = pytest.mark.timeout(600 if LONG else 180)


def report(name: str, figures: dict) -> None:
    """The figures of a run, one JSON line (read them with -s)."""
    print(f"\n[{name}] " + json.dumps(figures))


# --------------------------------------------------------------------------- PostgreSQL

async def _pg_restarts(private_pg, pg_store_factory, plan: list[tuple[str, float, float]],
                       *, tail: float, calls: int = 100) -> dict:
    """100 calls on one store while the cluster is restarted per `plan`: (mode, seconds of
    load before the stop, seconds down)."""
    store = await pg_store_factory()
    load = Load(store, calls=calls)
    outages = []

    async def fault():
        for mode, before, down in plan:
            await asyncio.sleep(before)
            outages.append(await private_pg.restart(mode, down))
        await asyncio.sleep(tail)  # the same store carries on after the last recovery

    await load.run(fault)
    figures = await check_log(store, load)

    # The outage really happened and the store rode it out without being reopened.
    assert store.stats["retries"] > 0, "no append was ever retried: was the database down?"
    for o in outages:
        during = load.issued_between(o.stop_at, o.up_at)
        assert during, f"no append was issued during the {o.mode} outage"
        if o.duration < load.long_timeout - 2:
            waited = [a for a in during if a.acknowledged and a.ended >= o.up_at - 0.5]
            assert waited, f"no append issued during the {o.mode} outage waited it out"
        else:  # longer than any append may wait: those issued once it was down all failed
            doomed = [a for a in during
                      if o.down_at <= a.issued <= o.up_at - load.long_timeout - 1]
            assert doomed and all(a.error is not None for a in doomed), (
                "an append outlived its deadline")
    last = outages[-1]
    after = [a for a in load.issued_between(last.up_at + 0.5, time.monotonic())
             if a.acknowledged]
    assert after, "nothing was appended after the last recovery"
    figures.update(outages=[{"mode": o.mode, "down_s": round(o.duration, 2)} for o in outages],
                   retries=store.stats["retries"],
                   issued_during_outages=sum(len(load.issued_between(o.stop_at, o.up_at))
                                             for o in outages))
    return figures


async def test_postgres_restart_while_100_calls_append(private_pg, pg_store_factory):
    # A crash, then an orderly shutdown (it sends every client a FATAL error first: the
    # race that left a pooled writer connection unusable showed up with `fast` only).
    figures = await _pg_restarts(private_pg, pg_store_factory,
                                 [("immediate", 4.0, 2.5), ("fast", 3.0, 1.0)], tail=3.0)
    report("pg restart", figures)
    assert figures["failed"] > 0, "no short-deadline append failed: the outage was too short"


@long_only
async def test_long_postgres_restarts(private_pg, pg_store_factory):
    plan = [("immediate", 10.0, 2.0), ("fast", 15.0, 5.0), ("immediate", 15.0, 10.0),
            ("fast", 15.0, 1.0), ("immediate", 15.0, 35.0)]  # the last outlasts the 30 s default
    figures = await _pg_restarts(private_pg, pg_store_factory, plan, tail=15.0)
    report("pg long", figures)


# --------------------------------------------------------------------------- SQLite

async def _sqlite_faults(store, db_path, fault_cm, plan: list[tuple[float, float]], *,
                         tail: float, calls: int = 100) -> dict:
    """100 calls on one SQLite store while `fault_cm()` holds, per `plan`: (seconds of load
    before, seconds held)."""
    load = Load(store, calls=calls)
    windows = []

    async def fault():
        for before, hold in plan:
            await asyncio.sleep(before)
            start = time.monotonic()
            with fault_cm():
                await asyncio.sleep(hold)
            windows.append((start, time.monotonic()))
        await asyncio.sleep(tail)

    await load.run(fault)
    figures = await check_log(store, load)
    assert store.stats["retries"] > 0, "no append was ever retried: did the fault bite?"
    for start, end in windows:
        hit = [a for a in load.issued_between(start, end)
               if a.error is not None or a.ended > end]
        assert hit, "no append issued during the fault failed or waited it out"
    after = [a for a in load.issued_between(windows[-1][1] + 0.5, time.monotonic())
             if a.acknowledged]
    assert after, "nothing was appended after the fault was lifted"
    errors = sorted({str(a.error) for a in load.appends if a.error is not None})
    figures.update(retries=store.stats["retries"], errors=errors[:3],
                   held_s=[round(e - s, 2) for s, e in windows])
    return figures


@pytest.fixture
def tiny_disk(tmp_path):
    disk = TinyDisk(tmp_path / "disk")
    try:
        disk.__enter__()
    except CannotFault as exc:
        pytest.skip(str(exc))
    try:
        yield disk
    finally:
        disk.__exit__()


async def test_sqlite_disk_full_while_100_calls_append(tiny_disk):
    async with migrated_sqlite(tiny_disk.path / "log.db") as store:
        figures = await _sqlite_faults(store, tiny_disk.path / "log.db", tiny_disk.full,
                                       [(3.0, 2.5)], tail=4.0)
    report("sqlite disk full", figures)
    assert figures["failed"] > 0
    assert all("disk is full" in e for e in figures["errors"]), figures["errors"]


@long_only
async def test_long_sqlite_disk_full(tiny_disk):
    async with migrated_sqlite(tiny_disk.path / "log.db") as store:
        figures = await _sqlite_faults(store, tiny_disk.path / "log.db", tiny_disk.full,
                                       [(10.0, 2.0), (15.0, 8.0), (15.0, 35.0), (15.0, 1.0)],
                                       tail=15.0)
    report("sqlite disk full long", figures)


async def test_sqlite_unwritable_while_100_calls_append(unwritable_dir):
    db = unwritable_dir / "log.db"
    async with migrated_sqlite(unwritable_dir / "log.db") as store:
        figures = await _sqlite_faults(store, db, lambda: Unwritable(db), [(3.0, 2.5)],
                                       tail=4.0)
    report("sqlite unwritable", figures)
    assert figures["failed"] > 0


@long_only
async def test_long_sqlite_unwritable(unwritable_dir):
    db = unwritable_dir / "log.db"
    async with migrated_sqlite(unwritable_dir / "log.db") as store:
        figures = await _sqlite_faults(store, db, lambda: Unwritable(db),
                                       [(10.0, 2.0), (15.0, 8.0), (15.0, 35.0), (15.0, 1.0)],
                                       tail=15.0)
    report("sqlite unwritable long", figures)


# --------------------------------------------------------------------------- the voice path

ORDER, WEATHER = "lookup_order", "get_weather"
MIC_FRAME = InputAudioRawFrame(audio=b"\0" * 640, sample_rate=16000, num_channels=1)  # 20 ms


def _voice_script(variant: str, *, ask_at_once: bool = False) -> Script:
    """Before the outage the bot says a little and asks for c0 (a slow tool, 2 s): the test
    takes the database down while c0 runs, so its result arrives during the outage. Then the
    bot speaks (paced like real speech, one 40 ms chunk every ~40 ms) and asks for c1 while
    the database is down; that turn ends during the outage too, so c1's start is due while
    the log cannot take it. `waits`: the user interrupts that turn, and the bot goes on
    with another one meanwhile. `fails`:
    nothing more happens until both are answered, so only the service itself can get them
    going again. `ask_at_once`: c1 is asked for the moment the database goes, while nothing
    else holds the log, so the receive loop itself tries to log it (and the audio after it
    waits for that try)."""
    # `waits`: the user barges in (serverContent.interrupted) and the bot answers.
    end = [Interrupted(), Sleep(0.5), Audio(chunks=50, pause_ms=40), TurnComplete()] \
        if variant == "waits" else [TurnComplete()]
    return Script([Audio(chunks=5), TurnComplete(), ToolCall(Call("c0", WEATHER, {"id": 0})),
                   WaitSignal("db_down", timeout=30),
                   *([] if ask_at_once else [Audio(chunks=15, pause_ms=40)]),
                   ToolCall(Call("c1", ORDER, {"id": 1})),
                   Audio(chunks=15, pause_ms=40), *end,
                   WaitToolResponse(["c0", "c1"], timeout=60), Audio(chunks=5), TurnComplete()],
                  reply=())


async def _feed_mic(ctl: Ctl) -> None:
    """The user's microphone: 20 ms frames into the pipeline, as an input transport does."""
    while True:
        await ctl.task.queue_frame(MIC_FRAME)
        await asyncio.sleep(0.02)


def _is_audio(message) -> bool:
    parts = (((message.get("serverContent") or {}).get("modelTurn") or {}).get("parts") or []
             if isinstance(message, dict) else [])
    return any("inlineData" in part for part in parts)


def _max_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch in [start, end] without a frame."""
    inside = [start, *(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(inside, inside[1:]))


async def _partition(proxy: PartitionProxy, down_for: float, on_down) -> Outage:
    """The network to the database goes silent for `down_for` seconds (nothing closes)."""
    stop_at = time.monotonic()
    proxy.partition()
    on_down()
    await asyncio.sleep(down_for)
    proxy.heal()
    return Outage("partition", stop_at, stop_at, time.monotonic(), time.monotonic())


# `fails`: appends give up after 1 s, and the silence watchdog (1 s) tries to log the end of
# speech while the database is still down. `waits` restarts with `fast`, `fails` crashes it.
# `partition`: the server stays up and the network to it goes silent: every append and read
# hangs until its attempt is cut (attempt_timeout, 1 s here), instead of failing at once.
@pytest.mark.parametrize("variant, append_timeout, mode, down_for",
                         [("waits", 30.0, "fast", 4.0), ("fails", 1.0, "immediate", 4.5),
                          ("waits", 30.0, "partition", 4.0)],
                         ids=["waits", "fails", "partition"])
async def test_voice_path_flows_while_postgres_restarts(private_pg, pg_store_factory, variant,
                                                        append_timeout, mode, down_for):
    """A real pipeline (DurableGeminiLiveLLMService, google-genai, the local Gemini Live
    server) while the database goes down and comes back: the bot's audio keeps playing and
    the user's audio keeps reaching Gemini. What must be logged first waits for the log: c0's
    result (it arrives during the outage) is sent only after it is logged, c1 (asked for
    during the outage) is logged after recovery and only then runs; each runs exactly once
    and is answered once. With a short append deadline (`fails`) the appends fail with
    StoreUnavailable during the outage (the service logs that and keeps the facts queued)
    and still go through after recovery."""
    proxy = await PartitionProxy("127.0.0.1", private_pg.port).start() \
        if mode == "partition" else None
    store = await pg_store_factory(append_timeout=append_timeout, via=proxy,
                                   **({"attempt_timeout": 1.0, "read_timeout": 1.0}
                                      if proxy else {}))
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR")
    marks: dict[str, float] = {}

    async def drive(ctl: Ctl) -> None:
        assert await ctl.wait(lambda: bool(ctl.ledger.runs), timeout=20), "c0 never started"
        mic = asyncio.create_task(_feed_mic(ctl))
        await asyncio.sleep(0.3)  # the microphone is flowing before the outage

        def on_down() -> None:
            marks["down"] = time.time()
            ctl.server.signal("db_down")

        try:
            outage = (await _partition(proxy, down_for, on_down) if proxy else
                      await private_pg.restart(mode, down_for, on_down=on_down))
            marks["up"] = time.time()
            marks["starting"] = marks["up"] - (outage.up_at - outage.start_at)
            await ctl.wait(lambda: len(ctl.results()) >= 2 and ctl.script_done(0)
                           and not ctl.tap.speaking, timeout=60)
        finally:
            mic.cancel()
        await ctl.settle(0.5)

    try:
        run = await run_call(Flavour("postgres", store),
                             [_voice_script(variant, ask_at_once=proxy is not None)], drive,
                             timeout=120, tool_delay={WEATHER: 2.0, ORDER: 0.05},
                             speaking_timeout_s=1.0 if variant == "fails" else 4.0)
    finally:
        logger.remove(sink)

    down, up = marks["down"], marks["up"]
    asked = next(m.at for m in run.connections[0].sent
                 if isinstance(m.message, dict) and "toolCall" in m.message
                 and "c1" in json.dumps(m.message))
    assert down <= asked <= up, "c1 was not asked for while the database was down"
    c0_done = run.runs("c0")[0]["t"] + 2.0
    assert down <= c0_done <= up, "c0's result did not arrive while the database was down"
    # The voice path: the bot's audio played on, the user's audio reached Gemini.
    played = [t for t in run.tap.audio_at if down <= t <= up]
    mic = [m.at for m in run.connections[0].received if m.kind == "realtime_input"]
    heard = [t for t in mic if down <= t <= up]
    assert played, "no bot audio reached the output while the database was down"
    assert heard, "no user audio reached Gemini while the database was down"
    # The microphone sends every 20 ms: a long silence at Gemini means the service held the
    # user's audio back (generous bound; the figures below say what it was).
    mic_gap = _max_gap(mic, down, up)
    assert mic_gap < 1.5, f"the user's audio stopped reaching Gemini for {mic_gap:.2f}s"
    # The bot's audio, from the outage until Gemini's last audio chunk sent during it,
    # including the pause between turns (0.5 s after the interruption in `waits`). A stall
    # lasts as long as the outage (seen: the receive loop waited for the log to record the
    # interruption, and the next turn's audio played only after the database was back).
    spoken_until = max(m.at for m in run.connections[0].sent
                       if m.at <= up and _is_audio(m.message))
    bot_gap = _max_gap(run.tap.audio_at, down, spoken_until)
    assert bot_gap < 2.0, f"the bot's audio stopped for {bot_gap:.2f}s during the outage"
    # Write-ahead: each waited for the log, then ran once and was answered once.
    assert_server_clean(run)
    c0 = assert_answered_once(run, "c0", WEATHER)
    c1 = assert_answered_once(run, "c1", ORDER)
    assert c0.at >= marks["starting"], "c0's result was sent before it could be logged"
    assert_ran_once(run, "c0")
    ran = assert_ran_once(run, "c1")
    assert ran["t"] >= marks["starting"], "c1 ran before the database was back"
    assert_log_settled(run)
    await assert_chain_ok(run)
    failures = [e for e in errors if "StoreUnavailable" in e or "within its deadline" in e]
    if variant == "fails":
        assert failures, "no append failed during the outage: the deadline was not short enough"
    report(f"voice {variant} {mode}", {
        "mode": mode, "down_s": round(up - down, 2), "bot_audio_frames_during": len(played),
        "max_bot_audio_gap_s": round(bot_gap, 3),
        "mic_frames_to_gemini_during": len(heard), "max_mic_gap_s": round(mic_gap, 3),
        "c0_answered_after_up_s": round(c0.at - up, 2),
        "c1_ran_after_up_s": round(ran["t"] - up, 2),
        "c1_answered_after_up_s": round(c1.at - up, 2),
        "append_failures_logged": len(failures), "store_retries": store.stats["retries"]})
    if proxy is not None:
        await proxy.close()
