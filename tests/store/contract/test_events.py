"""Events as stored: rows of an older schema load upcast, newer fields are read tolerantly,
an unreadable row is never skipped, and an append of values JSON cannot hold writes
nothing. Serialisation itself, without a database: tests/core/test_events.py."""

from __future__ import annotations

import math

import pytest

from session_store import events as ev
from session_store.errors import CorruptEvent, SchemaVersionTooNew, UnknownEventType
from session_store.storage.loading import load_state
from session_store.audit.verify import verify_log

from ...core.test_events import _names_the_event
from ..helpers import insert_raw_event, msg, opened


async def test_append_rejects_non_json_values_and_writes_nothing(store):
    with pytest.raises(ValueError):
        await store.append("s", [ev.ToolCallCompleted("c1", {"x": math.inf})], 0)
    assert await store.stream_version("s") == 0

async def test_old_schema_row_in_the_log_loads_upcast(store, migrated):
    await store.append("call", [opened(), ev.Connected(1)], 0)
    await insert_raw_event(migrated, "call", "connection.handle_issued", 1,
                           '{"generation":1,"handle":"h-v1"}')
    rec = (await store.read("call"))[-1]
    assert (rec.version, rec.schema_version) == (3, 1)
    assert rec.event == ev.HandleIssued(1, "h-v1", None)
    state = await load_state(store, "call")
    assert state.handles["h-v1"].last_consumed_client_message_index is None
    assert state.newest_handle == "h-v1"
    report, = await verify_log(store, "call")
    assert report.ok  # the hand-written row is a proper part of the chain
    assert await store.append("call", [msg(1)], 3) == 4

async def test_tolerant_reader_in_the_log(store, migrated):
    await insert_raw_event(migrated, "s", "session.closed", 1,
                           '{"reason":"done","future_field":[1,2]}')
    state = await load_state(store, "s")
    assert state.closed and state.version == 1

@pytest.mark.parametrize("etype,schema,payload,error", [
    ("conversation.message", 1, '{"role":"user","text":"hi"', CorruptEvent),
    ("conversation.message", 1, '"just a string"', CorruptEvent),
    ("speech.bot_sang", 1, '{"generation":1}', UnknownEventType),
    ("speech.bot_started", 9, '{"generation":1}', SchemaVersionTooNew),
])
async def test_unreadable_row_in_the_log_is_never_skipped(store, migrated, etype, schema,
                                                          payload, error):
    await store.append("call", [opened(), msg(1)], 0)
    bad = await insert_raw_event(migrated, "call", etype, schema, payload)
    await store.append("call", [msg(2)], 3)

    rows = await store.read("call")  # reading rows works: an auditor can still see them
    assert [r.version for r in rows] == [1, 2, 3, 4]
    assert rows[2].data_json == payload
    with pytest.raises(error) as err:
        rows[2].event
    _names_the_event(err.value, rows[2], etype)
    assert bad.version == 3

    for use_snapshot in (True, False):
        with pytest.raises(error) as err:
            await load_state(store, "call", use_snapshot=use_snapshot)
        assert (err.value.stream_id, err.value.version) == ("call", 3)
    before = await load_state(store, "call", to_version=2)  # the state before it still loads
    assert before.version == 2 and before.conversation == [("user", "turn 1")]
    everything = await store.read_all()
    assert any(r.version == 3 and r.stream_id == "call" for r in everything)
