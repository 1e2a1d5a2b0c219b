"""Issue #35 item 3: the CLI's rough edges a new user trips on."""

from __future__ import annotations

import inspect

import pytest

from session_store.commands.cli import app

from .conftest import running_viewer, viewer_client
from .helpers import acli, cli, one_line_error, support_call, write_call

SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


@pytest.fixture
async def one_call(migrated):
    await write_call(migrated, "support-1", support_call())
    return migrated


async def test_limit_counts_what_the_filter_lists(one_call):
    r = await acli("timeline", "support-1", "--lane", "tools", "--limit", "3", "--json",
                   backend=one_call)
    assert r.exit_code == 0, r.output
    import json

    entries = json.loads(r.stdout)["entries"]
    assert len(entries) == 3 and {e["lane"] for e in entries} == {"tools"}
    shown = (await acli("timeline", "support-1", "--lane", "tools", "--limit", "3",
                        backend=one_call)).stdout
    assert "versions 1–11 of 25" in shown, shown  # the versions searched to find them


async def test_an_unknown_event_type_errs_as_an_unknown_lane_does(one_call):
    one_line_error(await acli("timeline", "support-1", "--type", "bogus", backend=one_call),
                   "unknown event type 'bogus'", "tool.call_requested")
    for ok in ("tool.", "tool.*", "tool.call_requested"):
        r = await acli("timeline", "support-1", "--type", ok, backend=one_call)
        assert r.exit_code == 0 and "c1:" in r.stdout, (ok, r.output)


@SQLITE_ONLY
async def test_an_empty_database_says_so(migrated):
    assert (await acli("calls", backend=migrated)).stdout.strip() == "no calls yet"
    assert (await acli("calls", "--status", "open", backend=migrated)).stdout.strip() == \
        "no calls match"


def test_an_empty_db_option_errs_instead_of_reading_sessions_db(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(cli("calls", "--db", ""), "--db is empty")


def test_flags_are_shown_as_flags_and_summaries_whole(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    for info in app.registered_commands:
        first = info.help.split("\n\n")[0]
        assert "\n" not in first and first.rstrip().endswith((".", ")")), info.help
        doc = " ".join(inspect.cleandoc(info.callback.__doc__).split("\n\n")[0].split())
        assert first == doc  # the whole first paragraph, not its first source line
    for command in ("calls", "timeline", "export", "stats"):
        help_text = cli(command, "--help").stdout
        assert "--json" in help_text or command == "export"
        flags = [line for line in help_text.splitlines()
                 if any(f in line for f in ("--json ", "--redact ", "--failed "))]
        assert flags and not any("<bool>" in line for line in flags), (command, flags)
    one_line = cli("--help").stdout
    assert "reconnects, takeovers… Facts are the whole call's;" in " ".join(one_line.split())


def test_schema_lists_each_description_whole():
    from session_store.audit.models import SCHEMAS

    out = " ".join(cli("schema").stdout.split())
    for model in SCHEMAS.values():
        first = " ".join(inspect.cleandoc(model.__doc__).split("\n\n")[0].split())
        assert first in out, first


@SQLITE_ONLY
async def test_the_viewer_says_one_call_matches(one_call):
    with running_viewer(one_call) as base:
        async with viewer_client(base) as http:
            page = (await http.get("/")).text
    assert "1 call matches" in page and "1 calls match" not in page
