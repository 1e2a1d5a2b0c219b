"""Big calls: `timeline --json` and `export` stream (written as read, a chunk of events in
memory, not the call), `state` and `timeline` (text and --json: the facts) and the viewer's
pages and state inspector read and fold previews (memory bounded by the largest event),
`state` does not scrub values its text does not show, and `--json` text is written a piece
at a time.

Time to first byte and peak memory for a 100 MB call are measured in bench/big_calls.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

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


@pytest.mark.parametrize("call, window", [("support", None), ("support", (6, 11)),
                                          ("ten", None), ("ten", (3, 3)), ("big", (4, 5))])
async def test_views_of_previews_are_the_views_of_the_whole_call(migrated, call, window):
    """`timeline` and `state` text fold previews of the events (strings cut) instead of
    the events: what they print is the same as from the whole events' fold."""
    from session_store.audit import state_view
    from session_store.audit.export import without_values
    from session_store.audit.fmt import preview_record
    from session_store.audit.text import timeline_view

    timed = {"support": support_call, "ten": ten_megabyte_call,
             "big": lambda: big_call(4, 3 * MB)}[call]()
    await write_call(migrated, call, timed)
    store = await migrated.open(read_only=True)
    try:
        head = await store.stream_version(call)
        first, last = window or (1, head)
        summary = await call_summary(store, call, T0)
        texts = []
        for previews in (False, True):
            recs = (await reading.read_previews(store, call, first, last) if previews else
                    [preview_record(r) for r in await store.read(call, from_version=first,
                                                                 to_version=last)])
            prior, whole, note = await window_facts(store, call, first, last, head,
                                                    tool_calls=tool_calls_in(recs),
                                                    previews=previews)
            assert note is None
            tl = build_timeline(recs, call_id=call, t0_us=summary.started_at_us, prior=prior,
                                whole=whole)
            console = Console(file=io.StringIO(), width=120, color_system=None)
            console.print(timeline_view(tl))
            texts.append(console.file.getvalue())
            states = [without_values(state_view(await reading.state_at(
                store, call, v, previews=previews), call)) for v in range(first, last + 1)]
            texts.append(json.dumps(states, sort_keys=True))
        lean = await reading.state_at(store, call, previews=True)
        assert max(len(text) for _, text in lean.conversation) < 3000  # (folded from previews)
    finally:
        await store.close()
    assert texts[2] == texts[0] and texts[3] == texts[1]


async def test_a_state_cache_keeps_one_kind_of_state(migrated):
    await write_call(migrated, "c", support_call())
    store = await migrated.open(read_only=True)
    try:
        with pytest.raises(ValueError, match="either folds of previews or whole states"):
            await reading.state_at(store, "c", cache=reading.StateCache(), previews=True)
    finally:
        await store.close()


# The command run as a user runs it, in a process of its own, printing how much its resident
# memory grew at the most while it ran (the peak reset once the modules are imported).
_PEAK = """
import sys
import session_store.audit.redaction, session_store.audit.queries, session_store.commands.views
from session_store.audit import Redactor
from session_store.commands.cli import app

Redactor().scrub_text("warm 4155550123 a@b.de")  # (its lazy imports, as any command's)

def kb(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith(key + ":"))

start = kb("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from here on
code = 0
try:
    app(sys.argv[1:], prog_name="session-store")
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print((kb("VmHWM") - start) * 1024, file=sys.stderr)
sys.exit(code)
"""


def _grown(args: list[str], out) -> int:
    """Bytes the command's memory grew by at its peak (its output written to `out`)."""
    r = subprocess.run([sys.executable, "-c", _PEAK, *args], stdout=out,
                       stderr=subprocess.PIPE, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert r.returncode == 0, r.stderr
    return int(r.stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux peak reset")
@pytest.mark.timeout(120)
async def test_state_and_timeline_memory_is_bounded_by_the_largest_event(migrated, tmp_path):
    """`state` and `timeline` of a 96 MB call of 4 MB messages (its conversation in a
    state, the window in a list of events) grew by ~1.6x and ~2.5x the call; now by what
    one chunk of events and its previews take, whatever the call's size (measured: 8-10x
    the chunk); both print the right call."""
    size, n = 4 * MB, 24
    await write_call(migrated, "big", big_call(n, size))
    bound = 20 * max(size, reading.CHUNK_BYTES)
    assert bound < n * size
    out_path = tmp_path / "out"
    grown = {}
    for args in (["state", "big"], ["timeline", "big"]):
        with open(out_path, "w") as out:
            grown[args[0]] = await asyncio.to_thread(_grown, [*args, *migrated.cli_args], out)
        text = out_path.read_text()
        assert "big" in text and len(text) < 20_000, text
        if args[0] == "state":  # (the event it is at, and the tool call asked for)
            assert "tool.call_requested" in text and "lookup" in text, text
        else:
            assert f"versions 1–{n + 3}" in text and f"user: {n - 1}xxxxxx" in text, text
            assert 'c1: lookup({"q": "small"}) requested' in text, text
    assert max(grown.values()) < bound, {k: v / MB for k, v in grown.items()}


def _folded(monkeypatch) -> list[tuple[str, int]]:
    """The type and stored size of every event the readers fold into a state, from now on."""
    sizes: list[tuple[str, int]] = []
    real = reading.fold_into

    def fold_into(state, recs):
        sizes.extend((r.type, len(r.data_json)) for r in recs)
        return real(state, recs)

    monkeypatch.setattr(reading, "fold_into", fold_into)
    return sizes


def reissued_big_values() -> list:
    """1 MB messages around a tool call asked for with a 1 MB argument (v6), asked again
    on a new connection and re-issued (v11-12), answered with a 1 MB result (v13; the
    re-issued id takes it from the original) and sent (v14-15)."""
    big = "y" * MB
    timed = big_call(3)[:-1]
    timed += [(600, ev.ToolCallRequested("c1", "lookup", {"note": big}, 1)),
              (610, ev.ToolCallStarted("c1", 1, "k1", 1)),
              (620, ev.ConversationMessage("model", "z" * MB, 1)),
              (630, ev.Disconnected(1, "error", "connection reset")),
              (640, ev.Connected(2)),
              (650, ev.ToolCallRequested("c2", "lookup", {"note": big}, 2)),
              (650, ev.ToolCallReissued("c2", "c1")),
              (700, ev.ToolCallCompleted("c1", {"text": big + "!"})),
              (710, ev.ToolResultSending("c2", 2, "tool_response")),
              (720, ev.ToolResultSent("c2", 2, "tool_response")),
              (730, ev.ConversationMessage("user", "thanks", 1))]
    return timed


@pytest.mark.parametrize("window", [None, ("8", None), ("5", "3"), ("6", "2"),
                                    ("14", None)])
async def test_the_facts_of_timeline_json_are_folded_from_previews(migrated, monkeypatch,
                                                                   window):
    """`timeline --json` of a call of 1 MB values: the whole call's facts come from a fold
    of previews (it folded the whole call: its final state held the conversation, 303 MB
    for a 100 MB call); only the values the document shows whole from the final state (a
    call asked for before the window, or answered after it) are folded whole, from their
    own events. The document is the one built from the whole events' facts."""
    await write_call(migrated, "big", reissued_big_values())
    store = await migrated.open(read_only=True)
    try:
        head = await store.stream_version("big")
        first = int(window[0]) if window else 1
        last = min(head, first + int(window[1]) - 1) if window and window[1] else head
        recs = await store.read("big", from_version=first, to_version=last)
        prior, whole, _ = await window_facts(store, "big", first, last, head)
        summary = await call_summary(store, "big", T0)
    finally:
        await store.close()
    redactor = Redactor(RedactionConfig())
    expected = build_timeline(redactor.redact_records(recs), call_id="big",
                              t0_us=summary.started_at_us, prior=prior, whole=whole,
                              redact_state=redactor.redact_state).to_json(None)
    folded = _folded(monkeypatch)
    args = ["--from", window[0]] + (["--limit", window[1]] if window[1] else []) \
        if window else []
    r = await acli("timeline", "big", "--json", *args, backend=migrated)
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert {**got, "summary": None} == {**expected, "summary": None}
    for c in got["tool_calls"]:  # whole, from the events or from the final state
        assert len(c["args"]["note"]) == MB, c["tool_call_id"]
        if c["result"] is not None:
            assert len(c["result"]["text"]) == MB + 1, c["tool_call_id"]
    whole_folds = sorted(t for t, n in folded if n > 100_000)
    # Nothing of the conversation whole; of the tool events, only those whose values the
    # document takes from the final state (c1's or c2's request, c1's result).
    assert set(whole_folds) <= {"tool.call_requested", "tool.call_completed"}, whole_folds
    assert len(whole_folds) <= 3, whole_folds
    if not window:
        assert whole_folds == []


def inspected_call() -> list:
    """Values of 1 MB with a secret and a phone number across the inspector's cut (2000),
    and a 200 KB message (too long to scan for personal data: masked whole)."""
    from .helpers import SECRET

    def across(c: str) -> str:
        return "a " * 995 + SECRET + " call +49 30 12345678 " + c * MB

    return [(0, ev.SessionOpened("gemini-live", ["lookup"], "w1", 1)), (0, ev.Connected(1)),
            (10, ev.ConversationMessage("user", across("u"), 1)),
            (20, ev.ToolCallRequested("c1", "lookup", {"note": across("n"), "q": "x"}, 1)),
            (30, ev.ToolCallStarted("c1", 1, "k1", 1)),
            (40, ev.ConversationMessage("model", "m" * 200_000, 1)),
            (50, ev.ToolCallCompleted("c1", {"text": across("r")})),
            (60, ev.ConversationMessage("user", "short", 1))]


async def test_the_state_inspector_folds_previews_and_shows_what_it_showed(migrated,
                                                                           monkeypatch):
    """The viewer's state inspector (GET /api/state) of a call of 1 MB values: the state is
    a fold of previews and the event a preview, so no value is folded or scrubbed whole
    (it folded the whole state and scrubbed every value, then cut them: 11 s and 360 MB on
    a 100 MB call); what it shows, redacted or not, is what it showed; ?full=1 is whole."""
    from session_store.audit import export_line, state_view
    from session_store.audit.fmt import clip_strings
    from session_store.web.call_pages import INSPECTOR_STRING_MAX

    from .conftest import running_viewer, viewer_client
    from .test_web import href_of

    await write_call(migrated, "big", inspected_call())
    store = await migrated.open(read_only=True)
    expected = {}
    try:  # what the inspector showed: the whole state and event, redacted, then cut
        for redact in (False, True):
            config = RedactionConfig()
            redactor = Redactor(config.with_enabled() if redact else config)
            for at in range(1, 9):
                s = await reading.state_at(store, "big", at)
                rec = (await store.read("big", from_version=at, to_version=at))[0]
                view = {**redactor.redact_state(state_view(s, "big", max_items=100)),
                        "event": export_line(rec, redactor)}
                expected[redact, at] = clip_strings(view, INSPECTOR_STRING_MAX)
    finally:
        await store.close()
    folded = _folded(monkeypatch)
    scrubbed: list[int] = []
    real_scrub = redactor_module.Redactor.scrub_text
    monkeypatch.setattr(redactor_module.Redactor, "scrub_text",
                        lambda self, text: scrubbed.append(len(text)) or real_scrub(self, text))
    with running_viewer(migrated) as base:
        async with viewer_client(base, timeout=60) as http:
            for (redact, at), want in expected.items():
                r = await http.get(href_of("api/state", "big"),
                                   params={"at": at, **({"redact": "1"} if redact else {})})
                assert r.status_code == 200, r.text
                assert r.json() == json.loads(json.dumps(want)), (redact, at)
                assert "SECRET" not in r.text and (not redact or "12345678" not in r.text)
            assert max(n for _, n in folded) < 100_000
            assert max(scrubbed) < 100_000
            full = (await http.get(href_of("api/state", "big"),
                                   params={"at": 7, "full": "1"})).json()
            assert len(full["tool_calls"][0]["result"]["text"]) > MB


async def test_state_json_is_written_a_piece_at_a_time(migrated, monkeypatch):
    """`state --json` of a call with two 10 MB values: the text goes out a piece at a time
    (each value alone), never the whole document as one string (it wrote it whole: the
    state, its text and the pieces it was joined from, 446 MB for a 100 MB call); the text
    is the one it wrote."""
    import typer.testing

    from session_store.audit.jsontext import dumps

    await write_call(migrated, "big-1", ten_megabyte_call())
    writes: list[int] = []
    real_write = typer.testing._NamedTextIOWrapper.write

    def write(self, text):
        writes.append(len(text))
        return real_write(self, text)

    monkeypatch.setattr(typer.testing._NamedTextIOWrapper, "write", write)  # (the CLI's stdout)
    r = await acli("state", "big-1", "--json", backend=migrated)
    assert r.exit_code == 0, r.output[-2000:]
    assert r.output == dumps(json.loads(r.output), indent=2) + "\n"
    assert sum(writes) == len(r.output) and max(writes) < 10_000_000 + 1000, writes
