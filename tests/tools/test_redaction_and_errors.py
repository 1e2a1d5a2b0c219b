"""Secrets and personal data through the support tools; bad databases through the CLI.

Redaction fails closed (argument previews, failed handshakes' handles, rows this code cannot
interpret), replay output is redacted like every other output, and a database the tools
cannot use (or a URL they cannot parse) is a one-line error with exit code 2. Storage tests
run on SQLite and PostgreSQL (the `backend`/`migrated` fixtures of tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from session_store import events as ev
from session_store.audit import MASK, Redactor, export_line, load_config, replay
from session_store.commands.cli import app
from session_store.decide import FunctionCall, ToolCallsArrived, decide
from session_store.policy import Policy
from session_store.projection import fold
from tests.store.helpers import insert_raw_event, sql
from tests.tools.conftest import running_viewer, viewer_client
from tests.tools.helpers import acli, chain, support_call, write_call

EMAIL = "bob.jones@example.com"
PHONE = "+44 7700 900123"
TOKEN_VALUE = "tok-SECRET-abcdef"  # support_call()'s `auth_token` argument
SESSION_STORE = Path(sys.executable).parent / "session-store"


def _opened() -> list[tuple[float, ev.Event]]:
    return [(0, ev.SessionOpened("gemini-live", ["lookup_order"], "w1", 1, {"voice": "Puck"})),
            (0, ev.Connected(1))]


# --------------------------------------------------------------------------- redaction


def _decided_preview_call() -> list[tuple[float, ev.Event]]:
    """Events exactly as `decide` writes them for two hostile tool calls whose arguments
    carry an e-mail address: one over `max_args_bytes` (its args become a `_preview` string)
    and one whose id repeats an earlier call (the anomaly keeps an `args` preview string)."""
    timed = _opened()
    policy = Policy(max_args_bytes=80)
    state = fold(chain("preview-1", timed))
    args = {"email": EMAIL, "phone": PHONE, "note": "x" * 100}
    events = decide(state, ToolCallsArrived((FunctionCall("c1", "lookup_order", args),), 1),
                    policy)
    timed += [(100, e) for e in events]
    state = fold(chain("preview-1", timed))
    events = decide(state, ToolCallsArrived((FunctionCall("c1", "lookup_order",
                                                          {"email": EMAIL}),), 1), policy)
    timed += [(200, e) for e in events]
    kinds = [e.kind for _, e in timed if isinstance(e, ev.AnomalyRecorded)]
    assert kinds == ["tool_args_too_large", "duplicate_tool_call_id"], kinds
    return timed


async def test_redaction_masks_personal_data_inside_argument_previews(migrated):
    """`--redact` masks the `email`/`phone` argument keys (DEFAULT_REDACT_KEYS); the bounded
    stand-ins `decide` writes for hostile calls keep the arguments as a JSON *string*
    (`args._preview`, an anomaly's `detail.args`) whose keys cannot be matched: masked whole,
    in the export, the state and the timeline."""
    await write_call(migrated, "preview-1", _decided_preview_call())
    for command in (["export", "preview-1", "--redact"],
                    ["state", "preview-1", "--redact", "--json"],
                    ["timeline", "preview-1", "--redact", "--json"]):
        r = await acli(*command, backend=migrated)
        assert r.exit_code == 0, r.output
        plain = [x for x in command if x != "--redact"]  # the same output, unredacted
        assert "bob.jones" in (await acli(*plain, backend=migrated)).stdout  # really there
        assert EMAIL not in r.stdout and "7700 900123" not in r.stdout, \
            f"{' '.join(command)} leaks: " + next(line for line in r.stdout.splitlines()
                                                 if "bob.jones" in line or "7700" in line)


async def test_redaction_fingerprints_the_handle_of_a_failed_handshake(migrated):
    """Full redaction replaces resumption handles with a fingerprint, in connection events
    and in the `handshake_failed` anomaly the service writes (service/gemini_live.py:
    {"handle": handle, "error": ...}) alike."""
    handle = "resume-HANDLE-7f3e9a1c0b2d"
    timed = _opened() + [
        (100, ev.HandleIssued(1, handle, 0)),
        (200, ev.Disconnected(1, "error")),
        (300, ev.AnomalyRecorded("handshake_failed", {"handle": handle,
                                                      "error": "ConnectionClosedError: 1011"}, 1)),
        (300, ev.HandleRefused(1, handle, "refused")),  # passed over for good
        (400, ev.Connected(2)),
        # A handle the service withheld (it may predate a seed): a live handle all the same.
        (500, ev.HandleWithheld(2, handle + "-2")),
    ]
    await write_call(migrated, "handle-1", timed)
    r = await acli("export", "handle-1", "--redact", backend=migrated)
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[2]["data"]["handle"] != handle  # the handle_issued event: fingerprinted
    (withheld,) = [x for x in lines if x["type"] == "connection.handle_withheld"]
    assert withheld["data"]["handle"] != handle + "-2"
    (refused,) = [x for x in lines if x["type"] == "connection.handle_refused"]
    assert refused["data"]["handle"] == lines[2]["data"]["handle"]  # the same fingerprint
    leaked = [x["type"] for x in lines if handle in json.dumps(x)]
    assert leaked == [], f"raw resumption handle in a redacted export: {leaked}"


# Rows the redactor cannot interpret: --redact masks their text.
UNINTERPRETABLE = {
    # A broken row (torn write, bad disk): without --redact its text is exported scrubbed of
    # credential patterns only.
    "corrupt_json": ("conversation.message", 1,
                     '{"generation":1,"role":"user","text":"I am ' + EMAIL + ', call me'),
    # A log written by newer code: the same transcript under a field name this code does not
    # know, and a type this code does not know.
    "newer_schema": ("conversation.message", 2,
                     json.dumps({"generation": 1, "role": "user",
                                 "transcript": f"I am {EMAIL}"})),
    "unknown_type": ("conversation.user_transcript", 1,
                     json.dumps({"generation": 1, "text": f"I am {EMAIL}"})),
    # A known type whose field holds the wrong type (the reader refuses the row): the
    # settings as a list of pairs, the arguments as a list. What each part is cannot be told.
    "mistyped_settings": ("settings.changed", 1,
                          json.dumps({"keys": ["system_instruction"], "needs_reconnect": True,
                                      "values": [["system_instruction", f"Caller: {EMAIL}"]]})),
    "mistyped_args": ("tool.call_requested", 1,
                      json.dumps({"call_id": "c9", "name": "lookup_order", "generation": 1,
                                  "args": [{"contact": EMAIL}]})),
}


@pytest.mark.parametrize("kind", list(UNINTERPRETABLE))
async def test_redaction_masks_rows_it_cannot_interpret(migrated, kind):
    """`export` writes such rows (timeline and state refuse the call), flagged. With
    `--redact` it fails closed: what it cannot interpret by type and field is masked (every
    value of an unknown type or newer schema, the whole text of a corrupt row)."""
    etype, schema, payload = UNINTERPRETABLE[kind]
    await write_call(migrated, "odd-1", _opened())
    await insert_raw_event(migrated, "odd-1", etype, schema, payload)
    plain = await acli("export", "odd-1", backend=migrated)
    assert plain.exit_code == 0 and "bob.jones" in plain.stdout  # exported, flagged: fine
    r = await acli("export", "odd-1", "--redact", backend=migrated)
    assert r.exit_code == 0, r.output
    assert EMAIL not in r.stdout, f"export --redact ({kind}) leaks the transcript"


async def test_an_error_that_quotes_a_stored_value_never_prints_a_secret(migrated):
    """A field of the wrong type is named with (the start of) its value: the message goes
    out on stderr, in verify's report and in the viewer's 500 answers, scrubbed of what
    looks like a credential, as every output is. The row is still named."""
    from .helpers import SECRET

    await write_call(migrated, "odd-2", _opened())
    await insert_raw_event(migrated, "odd-2", "conversation.message", 1,
                           json.dumps({"generation": 1, "role": "user",
                                       "text": {"note": SECRET}}))
    for command in (["timeline", "odd-2"], ["state", "odd-2"], ["verify", "odd-2"],
                    ["verify", "odd-2", "--json"], ["verify"]):
        r = await acli(*command, backend=migrated)
        assert r.exit_code in (1, 2) and "odd-2" in r.output and "text" in r.output, r.output
        assert SECRET not in r.output and "sk-SECRET" not in r.output, (command, r.output)
    with running_viewer(migrated) as base:
        async with viewer_client(base) as client:
            for path in ("/calls/odd-2", "/api/timeline/odd-2", "/api/state/odd-2"):
                r = await client.get(path)
                assert r.status_code == 500 and "odd-2@3" in r.text, (path, r.text[:300])
                assert "sk-SECRET" not in r.text, (path, r.text[:300])


def test_redaction_masks_a_field_newer_code_added_at_the_same_schema():
    """The reader is tolerant (a field added by newer code at the same schema version is
    ignored when decoding): redaction is not, it masks what it does not know."""
    rec = chain("newer-1", [(0, ev.ConversationMessage("user", "hello", 1))])[0]
    rec = dataclasses.replace(rec, data_json=json.dumps(
        {"role": "user", "text": "hello", "generation": 1, "transcript": f"I am {EMAIL}"}))
    line = export_line(rec, Redactor(load_config(redact=True, env={})))
    assert line["data"] == {"role": "user", "text": MASK, "generation": 1, "transcript": MASK}
    assert line["redacted"] == ["data.text", "data.transcript"]
    assert export_line(rec, Redactor())["data"]["transcript"] == f"I am {EMAIL}"


def test_a_handle_quoted_in_a_failed_handshake_error_is_fingerprinted():
    """With transcripts left visible the anomaly's error stays, but not the handle in it."""
    handle = "resume-HANDLE-7f3e9a1c0b2d"
    rec = chain("handle-2", [(0, ev.AnomalyRecorded("handshake_failed", {
        "handle": handle, "error": f"invalid handle {handle}"}, 1))])[0]
    r = Redactor(dataclasses.replace(load_config(redact=True, env={}), transcripts=False))
    detail = export_line(rec, r)["data"]["detail"]
    assert detail == {"handle": r.fingerprint(handle),
                      "error": f"invalid handle {r.fingerprint(handle)}"}


# --------------------------------------------------------------------------- replay


async def test_replay_never_prints_a_secret_from_tool_arguments(migrated):
    """Secrets are masked "always" in every output: `replay` masks a divergence's
    `observation` (which carries the tool arguments) as it masks its logged and decided
    events, in JSON and in text."""
    await write_call(migrated, "support-1", support_call())
    for extra in (["--json"], []):
        r = await acli("replay", "support-1", "--defer", "none", *extra, backend=migrated)
        assert r.exit_code == 1, r.output  # a divergence was found and shown
        assert "auth_token" in r.stdout
        assert TOKEN_VALUE not in r.stdout, "replay prints the auth_token argument"


async def test_replay_obeys_the_redaction_config_as_every_output_does(migrated, tmp_path,
                                                                       monkeypatch):
    """A config file with `enabled = true` forces full redaction "for every output", and
    $SESSION_STORE_REDACT_KEYS implies it: `replay`, whose divergences carry the tool
    arguments, obeys both (and takes --redact like the other commands)."""
    await write_call(migrated, "support-1", support_call())
    plain = await acli("replay", "support-1", "--defer", "none", "--json", backend=migrated)
    assert plain.exit_code == 1 and "bob@example.com" in plain.stdout  # really there
    forced = tmp_path / "redact.toml"
    forced.write_text("[redaction]\nenabled = true\n")
    for env, extra in (({"SESSION_STORE_REDACT_CONFIG": str(forced)}, []),
                       ({"SESSION_STORE_REDACT_KEYS": "order_id"}, []), ({}, ["--redact"])):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            r = await acli("replay", "support-1", "--defer", "none", "--json", *extra,
                           backend=migrated)
        assert r.exit_code == 1 and json.loads(r.stdout)["divergences"], r.output
        assert "bob@example.com" not in r.stdout, f"replay ignores the redaction ({env, extra})"


async def test_the_viewer_redacts_replay_too(migrated):
    """The viewer redacts "every page and API answer": secrets always, everything configured
    when the server (`serve --redact`) or the request (`?redact=1`) asks; /api/calls/X/replay
    included (the observation too, and the logged/decided events)."""
    await write_call(migrated, "support-1", support_call())
    with running_viewer(migrated, redaction=load_config(redact=True, env={})) as base:
        async with viewer_client(base) as client:
            export = (await client.get("/export/support-1")).text
            assert "bob@example.com" not in export  # the export obeys serve --redact
            forced = await client.get("/api/replay/support-1", params={"defer": "none"})
    with running_viewer(migrated) as base:
        async with viewer_client(base) as client:
            asked = await client.get("/api/replay/support-1",
                                     params={"defer": "none", "redact": "1"})
    for r in (forced, asked):
        assert r.status_code == 200 and r.json()["divergences"], r.text
        assert TOKEN_VALUE not in r.text, "a secret in the replay API"
        assert "bob@example.com" not in r.text, "personal data in a redacted replay answer"
        for item in r.json()["divergences"][0]["logged"]:
            assert set(item) == {"type", "data"}, item  # redacted as an event, nothing added


def test_replay_fingerprints_the_handles_of_a_resumption_divergence():
    """A resumption divergence quotes both handles in its message: under full redaction they
    are the fingerprints its events show."""
    timed = _opened() + [(100, ev.HandleIssued(1, "h-AAA", 0)),
                         (200, ev.Disconnected(1, "error")), (300, ev.Connected(2, "h-ZZZ"))]
    redactor = Redactor(load_config(redact=True, env={}))
    d, = replay(chain("resume-1", timed), call_id="resume-1").redacted(redactor).divergences
    assert d.kind == "resumption" and "h-AAA" not in str(d) and "h-ZZZ" not in str(d)
    assert repr(redactor.fingerprint("h-ZZZ")) in d.message
    assert d.logged[0]["data"]["handle"] == redactor.fingerprint("h-ZZZ")
    assert d.decided == [{"resume_from": redactor.fingerprint("h-AAA")}]



def test_replay_shows_handles_as_they_are_without_redaction():
    """Handles are masked by --redact only (they are not secrets): an unredacted replay names
    the handles it compares, in the message and in what it decided."""
    timed = _opened() + [(100, ev.HandleIssued(1, "h-AAA", 0)),
                         (200, ev.Disconnected(1, "error")), (300, ev.Connected(2, "h-ZZZ"))]
    d, = replay(chain("resume-1", timed), call_id="resume-1").redacted(Redactor()).divergences
    assert "'h-ZZZ'" in d.message and "'h-AAA'" in d.message, d.message
    assert d.logged[0]["data"]["handle"] == "h-ZZZ"
    assert d.decided == [{"resume_from": "h-AAA"}]

# --------------------------------------------------------------------------- bad databases

_runner = CliRunner()


def _invoke(*args: str):
    return _runner.invoke(app, list(args))  # exceptions caught: a traceback is a result here


def _one_line_error(r) -> None:
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        f"raw {type(r.exception).__name__}: {r.exception}"
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.startswith("error:"), r.output


async def _newer_revision(backend) -> None:
    await sql(backend, "UPDATE alembic_version SET version_num = 'ffff_from_newer_code'")


async def test_migrate_refuses_a_schema_too_new_in_one_line(migrated):
    """Every command, `migrate` included (not Alembic's "Can't locate revision"), says
    "migrated by newer code: upgrade this code" (SchemaMismatch) in one line."""
    await _newer_revision(migrated)
    calls = await asyncio.to_thread(_invoke, "calls", *migrated.cli_args)
    _one_line_error(calls)
    _one_line_error(await asyncio.to_thread(_invoke, "migrate", *migrated.cli_args))


@pytest.mark.parametrize("url", [
    "postgresql+asyncpg://postgres:pw-in-url@127.0.0.1:1/test",          # nobody listens
    "postgresql+asyncpg://no_such_role:pw-in-url@127.0.0.1:5432/test",   # refused
    "sqlite+aiosqlite:////no/such/directory/log.db",                     # cannot open
])
def test_migrate_on_a_database_it_cannot_use_fails_in_one_line(url):
    """`calls` and `migrate` (the first command anyone runs) both say `error: cannot reach
    the database (...)` / `the database refused ...`, never the URL (it holds a password)."""
    _one_line_error(_invoke("calls", "--db", url))
    r = _invoke("migrate", "--db", url)
    assert "pw-in-url" not in r.output
    _one_line_error(r)


@pytest.mark.parametrize("command", [["calls"], ["verify"], ["timeline", "c1"], ["migrate"]])
def test_an_unparseable_url_is_a_one_line_error(command):
    """A mistyped --db (or $SESSION_STORE_URL) is bad input, one line from every command:
    a URL SQLAlchemy cannot parse (a path is a SQLite file: tests/tools/test_db_option.py)
    and an unsupported driver (`mysql`, which `migrate` would otherwise try to import)."""
    _one_line_error(_invoke(*command, "--db", "postgresql://u@[::1/db"))
    _one_line_error(_invoke(*command, "--db", "mysql://u@h/db"))
    r = _invoke(*command, "--db", "postgresql+asyncpg://u:pw-in-url@h:no_port/db")
    _one_line_error(r)
    assert "pw-in-url" not in r.output
    # A port that is a number but no port (asyncpg's OverflowError was a traceback, exit 1).
    for port in ("99999", "65536"):
        r = _invoke(*command, "--db", f"postgresql+asyncpg://u:pw-in-url@127.0.0.1:{port}/db")
        _one_line_error(r)
        assert "pw-in-url" not in r.output


async def test_serve_on_a_database_it_cannot_open_fails_in_one_line(migrated):
    """`serve` checks the store before uvicorn starts: SchemaMismatch / StoreUnavailable are
    one line and exit code 2, not uvicorn's "Application startup failed" traceback (exit 3)."""
    await _newer_revision(migrated)
    proc = await asyncio.to_thread(
        subprocess.run, [str(SESSION_STORE), "serve", "--port", "0", *migrated.cli_args],
        capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert "migrated by newer code" in out, out
    assert "Traceback" not in out and proc.returncode == 2, out


# --------------------------------------------------------------------------- secrets in the log


async def test_a_secret_inside_a_settings_object_never_reaches_the_log(store):
    """`_update_settings` logs `redact_settings({k: plain(value)})` (service/translate.py).
    `plain` keeps dicts and lists structured "so that redact_settings can still mask a
    secret nested in them by its key", but any other object (a pydantic model such as
    google-genai's HttpOptions, a dataclass) becomes `str(value)`, which hides the key from
    redact_settings: the service writes the secret into settings.changed."""
    from google.genai.types import HttpOptions
    from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

    from service.gemini_live import DurableGeminiLiveLLMService
    from service.translate import settings_snapshot

    secret = "AIzaSyFAKEfake0settings0object0key00"
    svc = DurableGeminiLiveLLMService(
        api_key="test-key", settings=GeminiLiveLLMService.Settings(model="models/x"),
        store=store, call_id="settings-1")
    await svc.driver.attach(model="models/x", tools=[], settings=settings_snapshot(svc._settings))
    delta = GeminiLiveLLMService.Settings()
    delta.extra = {"http_options": HttpOptions(base_url="https://proxy.example",
                                               headers={"x-goog-api-key": secret}),
                   "vendor": {"api_key": secret}}  # the control: a dict is masked
    try:
        await svc._update_settings(delta)
    except Exception:  # noqa: BLE001 - no pipeline: the reconnect it decides cannot start
        pass
    changed, = [r for r in await store.read("settings-1") if r.type == "settings.changed"]
    assert changed.data["values"]["vendor"] == {"api_key": "***"}
    assert secret not in changed.data_json, changed.data_json


def test_a_refused_value_quoted_in_an_sdk_error_is_masked_with_transcripts_shown():
    """A malformed toolCall's anomaly keeps the SDK's error as the diagnostic when the
    config shows transcripts, but pydantic quotes the refused value in it (the call's
    arguments here; a transcript elsewhere): that value is masked, the rest stays."""
    from google.genai import types

    frame = {"toolCall": {"functionCalls": [{"id": "c1", "name": "lookup",
                                              "args": f"order 42 for {EMAIL}"}]}}
    try:
        types.LiveServerMessage.model_validate(frame)
    except Exception as exc:  # noqa: BLE001 - the SDK's own error, as the service logs it
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    assert EMAIL in error  # the SDK really quotes it
    for cut in (error, error[:error.index(EMAIL) + 5]):  # whole, and cut inside the value
        rec = chain("bad-frame", [(0, ev.AnomalyRecorded("malformed_message", {
            "bytes": 120, "frame": "{...}", "error": cut, "fields": ["toolCall"]}, 1))])[0]
        r = Redactor(dataclasses.replace(load_config(redact=True, env={}), transcripts=False))
        line = export_line(rec, r)
        detail = line["data"]["detail"]
        assert EMAIL not in json.dumps(line) and EMAIL[:5] not in detail["error"], detail
        assert "toolCall.functionCalls.0.args" in detail["error"]  # the diagnostic stays
        assert f"input_value={MASK}" in detail["error"]
        assert "data.detail.error" in line["redacted"]
        assert export_line(rec, Redactor())["data"]["detail"]["error"] == cut  # not redacting
