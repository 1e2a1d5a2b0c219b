"""Big calls: `timeline --json` and `export` stream (written as read, a chunk of events in
memory, not the call), and `state` does not scrub values its text does not show.

Time to first byte and peak memory for a 100 MB call are measured in bench/big_calls.py.
"""

from __future__ import annotations

import json

import pytest

from session_store import events as ev
from session_store.audit import RedactionConfig, Redactor, build_timeline
from session_store.audit.queries import call_summary, reading, window_facts
from session_store.audit.redaction import redactor as redactor_module
from session_store.audit.streaming import write_timeline_json
from session_store.audit.timeline import Timeline, tool_calls_in

from .helpers import T0, acli, failing_call, support_call, ten_megabyte_call, write_call

MB = 1 << 20


def big_call(n: int, size: int = MB) -> list:
    """A call of `n` messages of `size` characters between small events."""
    timed = [(0, ev.SessionOpened("gemini-live", ["lookup"], "w1", 1)), (0, ev.Connected(1))]
    timed += [(10 + i, ev.ConversationMessage("user", f"{i}" + "x" * size, 1))
              for i in range(n)]
    return timed + [(500, ev.ToolCallRequested("c1", "lookup", {"q": "small"}, 1))]


@pytest.mark.parametrize("call, window, lanes, types", [
    ("support", None, [], []), ("support", (3, 9), [], []), ("support", None, ["tools"], []),
    ("support", (2, 12), [], ["tool."]), ("failing", None, [], []),
    ("failing", (4, 6), ["errors"], [])])
async def test_the_streamed_timeline_is_the_document_built_whole(migrated, call, window,
                                                                 lanes, types):
    """Byte for byte what `print_json(timeline.to_json())` wrote (redacted, windows, lanes
    and types; a takeover flags the entry before it, which is held until it is final)."""
    await write_call(migrated, call, support_call() if call == "support" else failing_call())
    store = await migrated.open(read_only=True)
    try:
        head = await store.stream_version(call)
        first, last = window or (1, head)
        recs = await store.read(call, from_version=first, to_version=last)
        prior, whole, note = await window_facts(store, call, first, last, head,
                                                tool_calls=tool_calls_in(recs))
        assert note is None
        summary = await call_summary(store, call, T0)
        redactor = Redactor(RedactionConfig().with_enabled())
        built = build_timeline(redactor.redact_records(recs), call_id=call,
                               t0_us=summary.started_at_us, prior=prior, whole=whole,
                               redact_state=redactor.redact_state).only(lanes, types)
        expected = json.dumps(built.to_json(summary), indent=2, ensure_ascii=False) + "\n"
        parts: list[str] = []
        await write_timeline_json(parts.append, store, call, first, last,
                                  t0_us=summary.started_at_us, prior=prior, whole=whole,
                                  summary=summary, redactor=redactor,
                                  keep=Timeline.keeps(lanes, types))
    finally:
        await store.close()
    assert "".join(parts) == expected


async def test_the_timeline_is_written_before_the_last_event_is_read(migrated, monkeypatch):
    """`timeline --json` of 6 x 1 MB messages: its head and first entries are out before the
    read that brings the last event (before: the whole document after every read)."""
    await write_call(migrated, "big", big_call(6))
    store = await migrated.open(read_only=True)
    log: list[tuple[str, int]] = []
    real_read = store.read

    async def read(*args, **kwargs):
        recs = await real_read(*args, **kwargs)
        log.append(("read", recs[-1].version if recs else 0))
        return recs

    monkeypatch.setattr(store, "read", read)
    try:
        head = await store.stream_version("big")
        prior, whole, _ = await window_facts(store, "big", 1, head, head)
        summary = await call_summary(store, "big", T0)
        log.clear()
        await write_timeline_json(lambda text: log.append(("write", len(text))), store, "big",
                                  1, head, t0_us=summary.started_at_us, prior=prior,
                                  whole=whole, summary=summary, redactor=Redactor(
                                      RedactionConfig()), keep=Timeline.keeps())
    finally:
        await store.close()
    last_read = log.index(("read", head))
    assert [kind for kind, _ in log[:last_read]].count("write") >= 3, log
    assert max(n for kind, n in log if kind == "write") < 3 * MB, "an entry of one event"


async def test_a_call_is_read_in_chunks_bounded_by_bytes(migrated, monkeypatch):
    """`iter_records` (export, the fold, the streamed timeline): chunks of about
    CHUNK_BYTES, or one event bigger than that; never the call at once."""
    monkeypatch.setattr(reading, "CHUNK_BYTES", 3 * MB)
    await write_call(migrated, "big", big_call(10) + [
        (600 + i, ev.ConversationMessage("model", f"small {i}", 1)) for i in range(40)])
    store = await migrated.open(read_only=True)
    try:
        chunks = [c async for c in reading.iter_records(store, "big")]
    finally:
        await store.close()
    versions = [r.version for c in chunks for r in c]
    assert versions == list(range(1, 54))
    sizes = [sum(len(r.data_json) for r in c) for c in chunks]
    assert max(sizes) <= 3 * MB + MB + 100, sizes


async def test_state_scrubs_only_what_its_text_shows(migrated, monkeypatch):
    """`state` of a call with two 10 MB values: its text shows neither, so neither is
    scrubbed (7 s before); `--json` shows them whole, scrubbed."""
    await write_call(migrated, "big-1", ten_megabyte_call())
    scrubbed: list[int] = []
    real = redactor_module.Redactor.scrub_text

    def scrub_text(self, text):
        scrubbed.append(len(text))
        return real(self, text)

    monkeypatch.setattr(redactor_module.Redactor, "scrub_text", scrub_text)
    r = await acli("state", "big-1", backend=migrated)
    assert r.exit_code == 0 and "session.closed" in r.output, r.output
    assert max(scrubbed, default=0) < 100_000, max(scrubbed)
    scrubbed.clear()
    r = await acli("state", "big-1", "--json", backend=migrated)
    view = json.loads(r.output)
    assert len(view["conversation"][0]["text"]) == 10_000_000
    assert view["tool_calls"][0]["args"]["note"] == "x" * 10_000_000
    assert max(scrubbed) >= 10_000_000


async def test_the_viewer_keeps_no_big_state(migrated):
    """The viewer's state cache holds at most `max_bytes` of states and none bigger than a
    quarter of it: one look at a 20 MB call left every state of it (the conversation
    whole, ~9 of them) in the viewer before."""
    await write_call(migrated, "big", big_call(2, 10 * MB))
    await write_call(migrated, "small", support_call())
    store = await migrated.open(read_only=True)
    cache = reading.StateCache(max_bytes=8 * MB)
    try:
        for at in (3, 4, 5):
            whole = await reading.state_at(store, "big", at, cache, remember=True)
            assert len(whole.conversation[0][1]) == 10 * MB + 1
        assert cache.size() == 0 and cache.best("big", 5) is None
        small = await reading.state_at(store, "small", None, cache, remember=True)
        kept = cache.best("small", small.version)
        assert kept is not None and kept is not small and kept.version == small.version
        assert 0 < cache.size() <= 8 * MB
        kept.conversation.clear()  # (a copy: the cache's own is untouched)
        assert cache.best("small", small.version).conversation == small.conversation
    finally:
        await store.close()


def test_the_cli_never_formats_a_whole_state(tmp_path, monkeypatch):
    """asyncio's runner formats its main task's result with repr() (when it restores the
    SIGINT handler, on the main thread): a command returning a 100 MB call's state spent
    200 MB and a second on its repr. Commands hand their results out behind a short one."""
    import asyncio

    from session_store.state import SessionState

    from ..conftest import Backend
    from .helpers import cli

    backend = Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'log.db'}")
    asyncio.run(backend.migrate())
    asyncio.run(write_call(backend, "c", support_call()))
    formatted: list[str] = []
    monkeypatch.setattr(SessionState, "__repr__", lambda self: formatted.append("state") or "S")
    r = cli("state", "c", backend=backend)  # (here, on the main thread)
    assert r.exit_code == 0, r.output
    assert formatted == []
