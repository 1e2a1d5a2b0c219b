"""Security faults of issue #6: secrets never stored, SQL only with bound parameters.

See test_hostile_storage.py's docstring for the whole matrix of issue #6 items 7 and 8.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pipecat.frames.frames import LLMUpdateSettingsFrame
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.gemini_live import DurableGeminiLiveLLMService
from service.local_live import (Audio, Call, LocalLiveServer, Script, ToolCall, TurnComplete,
                                WaitToolResponse)
from rig.testing.pipeline import tools_schema
from session_store import events as ev
from session_store.audit.fmt import iso
from session_store.storage.schema import valid_id
from session_store.audit.verify import verify_log
from tests.service.helpers import Ctl, Flavour, run_call
from tests.store.helpers import sql
from tests.tools.helpers import HOUR_US, T0, cli, support_call, write_call

from .secret_scan import find, sqlite_checkpoint, stored_bytes

# Alphanumeric and distinctive: nothing else in a log could contain them by chance.
API_KEY = "AIzaFAKEkey0hostile0storage0Q7c1e9d2b4a6f"
SETTING_SECRET = "settingSECRET0api0key0e5d4c3b2a1Z9"
NESTED_SECRET = "nestedSECRET0client0secret0f00dfeed42"
SECRETS = (API_KEY, SETTING_SECRET, NESTED_SECRET)
#: Hypothesis examples per fuzzed CLI surface and database (FAULTS_FUZZ_EXAMPLES=500 by hand).
FUZZ_EXAMPLES = int(os.environ.get("FAULTS_FUZZ_EXAMPLES", "60"))


class KeyedFlavour(Flavour):
    """Our service with a real-looking API key (the shared harness uses a fixed test key)."""

    def make_llm(self, server, *, call_id, system_instruction, tools, policy, model=None,
                 **extra):
        return DurableGeminiLiveLLMService(
            api_key=API_KEY,
            settings=GeminiLiveLLMService.Settings(model=model or self.model,
                                                   system_instruction=system_instruction),
            tools=tools_schema(list(tools)), http_options=server.http_options(),
            store=self.store, call_id=call_id, policy=policy, **extra)


@pytest.fixture
def key_on_the_wire(monkeypatch):
    """The API key each websocket handshake carried, as the local server received it."""
    seen: list[str | None] = []
    check_path = LocalLiveServer._check_path

    def recording(self, connection, request):
        seen.append(request.headers.get("x-goog-api-key"))
        return check_path(self, connection, request)

    monkeypatch.setattr(LocalLiveServer, "_check_path", recording)
    return seen


# --------------------------------------------------------------------------- secrets

@pytest.mark.timeout(120)
async def test_a_real_call_with_a_key_leaves_it_in_no_stored_byte(backend, store,
                                                                  key_on_the_wire):
    """A call through the real pipeline and google-genai client, configured with an API key,
    changing its settings mid-turn with secret-named values (one nested), surviving a
    refused handshake (its error text is logged) and a reconnect: then every byte the
    database holds is searched for each secret, verbatim, hex and base64."""
    scripts = [
        Script([Audio(chunks=15), ToolCall(Call("c1", "lookup_order", {"id": 1})),
                Audio(chunks=10), TurnComplete(),
                WaitToolResponse("c1", timeout=3, required=False), Audio(chunks=2),
                TurnComplete()], reply=()),
        Script(refuse_setup=1011),  # the reconnect's first handshake fails
        Script([WaitToolResponse("c1", timeout=6), Audio(chunks=2), TurnComplete()], reply=()),
    ]

    async def drive(ctl: Ctl):
        await ctl.wait(lambda: ctl.tap.speaking, timeout=5)
        delta = GeminiLiveLLMService.Settings(system_instruction="You are terse now.")
        delta.extra = {"api_key": SETTING_SECRET,
                       "vendor_options": {"region": "eu", "client_secret": NESTED_SECRET}}
        await ctl.task.queue_frame(LLMUpdateSettingsFrame(delta=delta))
        assert await ctl.wait(lambda: ctl.script_done(2) and not ctl.tap.speaking, timeout=15), \
            "the call did not get through its three connections"
        await ctl.settle()

    run = await run_call(KeyedFlavour(backend.name, store), scripts, drive)

    # The secrets were really in play: the key went out on every handshake, and the settings
    # change and the refused handshake were logged (with the error's text).
    assert len(key_on_the_wire) >= 3 and set(key_on_the_wire) == {API_KEY}
    changed, = [e.event for e in run.events if e.type == "settings.changed"]
    assert changed.values["api_key"] == "***"
    assert changed.values["vendor_options"] == {"region": "eu", "client_secret": "***"}
    assert run.find("anomaly.recorded", kind="handshake_failed"), run.timeline()
    assert run.state.closed and run.state.calls["c1"].status == "completed", run.timeline()
    assert len(run.events) >= 20  # a real log, not an empty one

    blobs = await stored_bytes(backend)  # SQLite: file, WAL and shm while the store is open
    if backend.name == "sqlite":
        assert {"log.db", "log.db-wal", "log.db-shm"} <= set(blobs), list(blobs)
    else:
        assert set(blobs) == {"alembic_version", "session_events", "session_snapshots",
                              "session_streams"}
    assert run.call_id.encode() in b"".join(blobs.values())  # the scan does see the call
    for secret in SECRETS:
        assert find(blobs, secret) == [], f"{secret} is stored"
    if backend.name == "sqlite":
        sqlite_checkpoint(backend.url)  # everything moved from the WAL into the file
        blobs = await stored_bytes(backend)
        for secret in SECRETS:
            assert find(blobs, secret) == [], f"{secret} is stored after a checkpoint"

    # Control: the same scan does find a secret that is stored, as is and as base64.
    await store.append("control", [ev.ConversationMessage("user", f"my key is {API_KEY}"),
                                   ev.ConversationMessage("user", "b64 " + base64.b64encode(
                                       b"xy" + NESTED_SECRET.encode()).decode())], 0)
    found = find(await stored_bytes(backend), API_KEY) + find(await stored_bytes(backend),
                                                              NESTED_SECRET)
    assert any("plain" in f for f in found) and any("base64+2" in f for f in found), found
    if backend.name == "sqlite":
        assert any(f.endswith("-wal: plain") for f in found), found  # not yet checkpointed
        sqlite_checkpoint(backend.url)
        assert any(f.startswith("log.db: plain") for f in find(await stored_bytes(backend),
                                                               API_KEY))


# --------------------------------------------------------------------------- bound parameters

#: Call ids chosen to break string-built SQL, LIKE patterns and case folding.
FUZZ_IDS = ["support-1", "Support-1", "SUPPORT_1", "a%b", "a_b", "aXb", "a\\b", "a\\\\b",
            "o'brien", "o''brien", 'say "hi"', "名前-1", "ÜMLAUT-ü", "emoji-😀", "tab\tid",
            "semi;colon -- x", "x' OR '1'='1", "100%", "__init__", "[bold]x[/]", "$1", ":s",
            "?"]
FUZZ_ALPHABET = list("abSsuptUPOR1-_%\\'\";:?$[]/ \t*=()") + ["😀", "名", "ü", "Ü", "\x00",
                                                                "\ud800", "\u202e"]


@dataclass(frozen=True)
class FuzzCall:
    call_id: str
    created_us: int
    closed: bool
    recent: bool  # an event within the last minute (else days ago)


async def _populate_fuzz_log(backend) -> list[FuzzCall]:
    now = time.time_ns() // 1000
    calls = []
    for i, call_id in enumerate(FUZZ_IDS):
        recent = i % 3 == 0
        t0 = now - 60_000_000 - i * 1000 if recent else T0 + i * HOUR_US
        timed = support_call()[:5] + ([(10, ev.SessionClosed("ended"))] if i % 2 else [])
        await write_call(backend, call_id, timed, t0)
        calls.append(FuzzCall(call_id, t0, bool(i % 2), recent))
    return calls


def _expected_page(calls: list[FuzzCall], *, search, after, status, since_us, until_us,
                   limit) -> list[str] | None:
    """list_calls' answer computed in Python on the same data (the model the SQL must equal);
    None: an error (`after` names no call)."""
    if after is not None and after not in {c.call_id for c in calls}:
        return None
    if search is not None and not valid_id(search, 10_000):
        return []

    def status_of(c: FuzzCall) -> str:
        return "closed" if c.closed else ("open" if c.recent else "stale")

    rows = [c for c in calls
            if (since_us is None or c.created_us >= since_us)
            and (until_us is None or c.created_us < until_us)
            and (not search or search in c.call_id)
            and (status is None or status_of(c) == status)]
    if after is not None:
        start = next(c.created_us for c in calls if c.call_id == after)
        rows = [c for c in rows if c.created_us < start]
    rows.sort(key=lambda c: (c.created_us, c.call_id), reverse=True)
    return [c.call_id for c in rows[:limit]]


async def _table_counts(backend) -> dict[str, int]:
    names = ("alembic_version", "session_events", "session_streams", "session_snapshots")
    return {n: (await sql(backend, f"SELECT count(*) FROM {n}"))[0][0] for n in names}


@pytest.mark.timeout(240)
async def test_cli_filters_and_call_ids_are_bound_parameters(migrated):
    """Hypothesis fuzzes `calls` filters (search, after, status, since, until, limit) and the
    call id of every per-call command, with quotes, LIKE wildcards, backslashes, NUL, lone
    surrogates and case variants, against a log of calls with such ids: each answer equals a
    Python filter of the same data; the schema and every row are intact afterwards."""
    calls = await _populate_fuzz_log(migrated)
    before = await _table_counts(migrated)
    ids = [c.call_id for c in calls]
    pieces = sorted({c[i:j] for c in ids for i in range(len(c)) for j in range(i + 1, len(c) + 1)
                     if j - i <= 4})
    text = st.text(FUZZ_ALPHABET, min_size=1, max_size=12)
    times = sorted(c.created_us for c in calls)

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(search=st.none() | st.sampled_from(pieces) | st.sampled_from(pieces).map(str.swapcase)
           | text,
           after=st.none() | st.sampled_from(ids) | text,
           status=st.sampled_from([None, "open", "closed", "stale"]),
           since=st.none() | st.sampled_from(times), until=st.none() | st.sampled_from(times),
           limit=st.integers(1, 30))
    # Found by this fuzz: SQLite's LIKE ignored case ("su" listed SUPPORT_1 and Support-1).
    @example(search="su", after=None, status=None, since=None, until=None, limit=30)
    @example(search="%", after=None, status=None, since=None, until=None, limit=30)
    @example(search="_", after="a_b", status=None, since=None, until=None, limit=30)
    @example(search="\\", after=None, status="closed", since=None, until=None, limit=30)
    @example(search="'", after="x' OR '1'='1", status=None, since=None, until=None, limit=30)
    def listing(search, after, status, since, until, limit):
        args = ["calls", "--json", "--limit", str(limit)]
        for flag, value in (("--search", search), ("--after", after), ("--status", status),
                            ("--since", iso(since) if since else None),
                            ("--until", iso(until) if until else None)):
            if value is not None:
                args += [flag, value]
        r = cli(*args, backend=migrated)
        expected = _expected_page(calls, search=search, after=after, status=status,
                                  since_us=since, until_us=until, limit=limit)
        if expected is None:
            assert r.exit_code == 2 and "there is no call" in r.output, (args, r.output)
            return
        assert r.exit_code == 0, (args, r.output)
        got = [c["call"] for c in json.loads(r.stdout)["calls"]]
        assert got == _expected_page(calls, search=search, after=after, status=status,
                                     since_us=since, until_us=until, limit=limit), args

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(call=st.sampled_from(ids) | text | st.sampled_from(ids).map(str.swapcase),
           command=st.sampled_from(["state", "timeline", "export", "verify", "replay"]))
    def per_call(call, command):
        # Options first, then "--": an id may begin with "-" (as a shell user must write it).
        r = cli(command, *(["--json"] if command != "export" else []),
                *migrated.cli_args, "--", call)
        assert "Traceback" not in r.output
        if call in ids:
            assert r.exit_code in (0, 1) if command == "replay" else r.exit_code == 0, r.output
            if command == "export":
                assert {json.loads(x)["call"] for x in r.stdout.splitlines()} == {call}
            elif command in ("state", "timeline"):
                assert json.loads(r.stdout)["call"] == call
        else:
            assert r.exit_code == 2 and "not found" in r.stderr, (command, call, r.output)

    await asyncio.to_thread(listing)
    await asyncio.to_thread(per_call)
    assert await _table_counts(migrated) == before
    store = await migrated.open()
    try:
        reports = await verify_log(store)
    finally:
        await store.close()
    assert sorted(r.stream_id for r in reports) == sorted(ids) and all(r.ok for r in reports)


# --------------------------------------------------------------------------- SQL by construction

ROOT = Path(__file__).resolve().parents[2]
SQL_WORD = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|WITH|FROM|WHERE|"
                      r"SET|VALUES|RETURNING|LISTEN|NOTIFY)\b")
#: What string-built SQL in the product may interpolate: table names from the schema module
#: and an integer constant (checked below to be exactly that). Nothing that comes from a call
#: id, a filter, a payload or configuration.
ALLOWED_IN_SQL = {"streams.name", "events.name", "_S", "_E", "BUSY_TIMEOUT_MS",
                  "int(busy_timeout_ms)",  # an int() cannot carry SQL
                  # the PostgreSQL batch function: its name, its error code, "$1, ..., $16"
                  "_FN", "HEADS_MOVED", "', '.join((f'${i}' for i in range(1, 17)))",
                  # the SQLite one-statement append: its view's name, its abort message
                  "APPEND_VIEW", "HEAD_MOVED"}
#: text() of a name: module constants of statements.py, whose f-strings the rule on
#: interpolation checks like any other.
ALLOWED_TEXT_NAMES = {"READERS_HORIZON"}
#: The one `.format` on SQL: a run of "?" placeholders for the number of bound values.
ALLOWED_FORMAT = {("session_store/storage/sqlite/commit.py",
                   "st.select_heads.format(marks=','.join('?' * len(part)))")}


def _product_sources():
    for folder in ("session_store", "migrations"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def _sql_findings(sources) -> tuple[set[str], set[tuple[str, str]], list[str]]:
    """(values interpolated into SQL text, .format() calls, SQL built by % / + / .format or
    a non-constant text()) over (name, ast) pairs."""
    interpolated, formats, bad = set(), set(), []
    for name, tree in sources:
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                if SQL_WORD.search(literal):
                    interpolated |= {ast.unparse(v.value) for v in node.values
                                     if isinstance(v, ast.FormattedValue)}
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
                for side in (node.left, node.right):
                    if isinstance(side, ast.Constant) and isinstance(side.value, str) \
                            and SQL_WORD.search(side.value):
                        bad.append(f"{name}:{node.lineno}: SQL built with % or +")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "format":
                    formats.add((name, ast.unparse(node)))
                if node.func.attr in ("execute", "exec_driver_sql", "executemany", "fetch",
                                      "fetchrow", "fetchval") and node.args:
                    first = node.args[0]
                    if isinstance(first, ast.JoinedStr):  # whatever its words: allowed names only
                        interpolated |= {ast.unparse(v.value) for v in first.values
                                         if isinstance(v, ast.FormattedValue)}
                    elif isinstance(first, ast.BinOp) or (
                            isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute)
                            and first.func.attr == "format"):
                        bad.append(f"{name}:{node.lineno}: {ast.unparse(first)[:60]}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "text":
                arg = node.args[0] if node.args else None
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                        or isinstance(arg, ast.Name) and arg.id in ALLOWED_TEXT_NAMES):
                    bad.append(f"{name}:{node.lineno}: text() of a non-constant")
    return interpolated, formats, bad


def test_sql_is_never_built_from_runtime_values():
    """Static: no f-string, %-format or .format() builds SQL from anything but the schema's
    table names, a constant and a run of "?" placeholders; text() and execute() only ever
    get constant strings or SQLAlchemy constructs (bound parameters)."""
    interpolated, formats, bad = _sql_findings(_product_sources())
    assert bad == []
    assert interpolated <= ALLOWED_IN_SQL, interpolated - ALLOWED_IN_SQL
    assert formats == ALLOWED_FORMAT, formats ^ ALLOWED_FORMAT
    # What the allowed names are: plain identifiers and an integer, fixed at import.
    from session_store.storage.schema import events, streams
    from session_store.storage.postgres import statements as postgres
    from session_store.storage.sqlite import commit as sqlite_commit
    from session_store.storage.sqlite import statements as sqlite
    for ident in (streams.name, events.name, postgres._S, postgres._E):
        assert re.fullmatch(r"[a-z_]+", ident)
    assert type(sqlite_commit.BUSY_TIMEOUT_MS) is int
    assert re.fullmatch(r"pg_temp\.[a-z_]+", postgres._FN)
    assert re.fullmatch(r"[A-Z0-9]{5}", postgres.HEADS_MOVED)
    assert re.fullmatch(r"[a-z_]+", sqlite_commit.APPEND_VIEW)
    assert re.fullmatch(r"[a-z_: ]+", sqlite_commit.HEAD_MOVED)
    assert all(re.fullmatch(r"[a-z_]+", c) for c in sqlite_commit.APPEND_COLUMNS)
    # The writer process runs only SQL the store compiled at import from these.
    assert sqlite.compile_statements().select_heads == sqlite.SELECT_HEADS
    # The scan can fail: each way of splicing a value into SQL is caught.
    spliced = ast.parse(
        "conn.execute(f\"SELECT * FROM t WHERE id = '{call_id}'\")\n"
        "q = \"DELETE FROM t WHERE id = '%s'\" % call_id\n"
        "conn.execute(\"SELECT {}\".format(col))\n"
        "conn.execute(text(\"SELECT \" + col))\n"
        "conn.execute(text(query))\n"
        "conn.execute(text(READERS_HORIZON))\n")
    got_interpolated, _, got_bad = _sql_findings([("spliced.py", spliced)])
    assert got_interpolated == {"call_id"}
    assert sorted({int(b.split(":")[1]) for b in got_bad}) == [2, 3, 4, 5], got_bad
    assert isinstance(postgres.READERS_HORIZON, str)


@pytest.mark.parametrize("schema", ["x; DROP TABLE session_events", "a,public", 'q"uote',
                                    "1abc", "", "a" * 64, "s\x00", "pg_temp x"])
async def test_a_schema_name_from_configuration_is_an_identifier_or_refused(schema, tmp_path):
    """The one piece of configuration that reaches SQL text (the PostgreSQL search path):
    the store and migrate refuse anything but a plain identifier, and the CLI says so in one
    line; nothing is created."""
    from session_store import open_store
    from session_store.storage.migrate import upgrade
    from tests.conftest import PG_URL

    if schema:
        with pytest.raises(ValueError, match="invalid schema name"):
            await open_store(PG_URL, schema=schema)
        with pytest.raises(ValueError, match="invalid schema name"):
            await upgrade(PG_URL, schema=schema)
    for command in (["migrate"], ["calls"], ["verify"]):
        r = await asyncio.to_thread(cli, *command, "--db", PG_URL, "--schema", schema)
        if not schema:  # "--schema ''" means none: the default search path, not an error
            continue
        assert r.exit_code == 2 and "invalid schema name" in r.stderr, r.output
        assert "Traceback" not in r.output


# --------------------------------------------------------------------------- the viewer's token

async def test_an_empty_token_is_refused_not_taken_as_a_token(migrated):
    """An empty token (an empty $SESSION_STORE_WEB_TOKEN) used to switch the loopback-host
    rule off and then accept `?token=` from any page: now it is refused where it is given."""
    from session_store.web import check_bind, create_app

    for token in ("", "   ", "\t"):
        with pytest.raises(ValueError, match="token is empty"):
            check_bind("127.0.0.1", token)
        with pytest.raises(ValueError, match="token is empty"):
            create_app(migrated.url, schema=migrated.options.get("schema"), token=token)
        r = await asyncio.to_thread(cli, "serve", "--token", token, backend=migrated)
        assert r.exit_code == 2 and "token is empty" in r.stderr, r.output
    check_bind("127.0.0.1", None)  # no token: loopback only, which stays allowed
