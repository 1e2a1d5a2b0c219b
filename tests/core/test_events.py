"""Event serialisation: round trip of the whole catalogue, upcasting of old schema versions,
tolerant reading of newer fields, and loud, named errors for what this code cannot read
(never skipped: skipping would silently change the projection)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from session_store import codec, events as ev
from session_store.errors import (CorruptEvent, EventDecodeError, SchemaVersionTooNew,
                                  SessionStoreError, UnknownEventType)
from session_store.events import canonical_json, catalogue, decode

from .helpers import msg, opened, raw_record

SAMPLES: list[ev.Event] = [
    opened(), ev.WorkerAttached("w2", 2, "deploy"), ev.SessionClosed("hangup"),
    ev.Connected(2, handle="h1", system_instruction_sha256="ab" * 32),
    ev.Disconnected(1, "go_away", "deadline"), ev.HandleIssued(1, "h1", 12),
    ev.HandleWithheld(2, "h0"), ev.HandleRefused(1, "h1", "failing", 2),
    ev.SendUnread(2, turn_under_way=True), ev.EarlierTurnEnded(2), ev.ModelReacted(2),
    ev.HoldsAll(3),
    ev.GoAwayReceived(1, 58.5), ev.ReconnectRequested("settings", ["system_instruction"]),
    ev.BotStartedSpeaking(1), ev.BotStoppedSpeaking(1, "transport"), ev.Interrupted(1),
    ev.SettingsChanged(["voice"], {"voice": "Puck"}, True),
    ev.SettingsChanged(["system_instruction"], {"system_instruction": "x"}, False, True),
    ev.ToolCallRequested("c1", "lookup", {"q": "x", "n": [1, {"k": None}]}, 1,
                         "non_blocking", "NON_BLOCKING"),
    ev.ToolCallProgress("c1", 1, {"step": 1}, "SILENT"),
    ev.InteractionStatus(2, "IN_PROGRESS", "server"),
    ev.ContextSending(2, 14), ev.ContextSent(2, 14),
    ev.ConversationSending(3, 20, "seed"), ev.ConversationSent(3, 20, "content"),
    ev.ToolCallReissued("c2", original="c1"), ev.ToolCallDeferred("c1"), ev.ToolCallStarted("c1", 1, "call:c1", 1),
    ev.ToolCallCompleted("c1", {"ok": True, "items": [1.5, "é"]}, reused_from="c0"),
    ev.ToolCallFailed("c1", "boom", outcome_unknown=True), ev.ToolCallCancelled("c1", "server"),
    ev.ToolOutcomeChecked("c1", "done"),
    ev.ToolResultSending("c1", 1, "tool_response"), ev.ToolResultSent("c1", 1, "content"),
    ev.ToolResultSending("c1", 2, "text", 1), ev.ToolResultSent("c1", 2, "text", 1),
    ev.ConversationMessage("assistant", "hello", 1),
    ev.ConversationMessageCut("hel —", 1),
    ev.CutTelling(1, 14, "content"), ev.CutTold(1, 14, "content"),
    ev.CutUntold(1, 14, "3.1 takes no clientContent after the first model turn"),
    ev.AnomalyRecorded("duplicate_tool_call_id", {"call_id": "c1"}, 1),
    ev.ObservationRecorded("ToolCallsArrived", {"calls": [{"call_id": "c1", "args": None}],
                                                "generation": 1}, 1,
                           {"calls.0.args": [0, "args"]}),
]


# --------------------------------------------------------------------------- round trip

def test_every_catalogue_type_round_trips():
    assert {type(e).TYPE for e in SAMPLES} == set(catalogue()), "add a sample for new types"
    for e in SAMPLES:
        text = canonical_json(e.to_data())
        assert decode(e.TYPE, e.SCHEMA, json.loads(text)) == e
        rec = raw_record("s", 1, e.TYPE, e.SCHEMA, text)
        assert rec.event == e and rec.data == e.to_data()
        assert rec.to_json()["data"] == e.to_data()


def test_canonical_json_is_one_spelling():
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_events_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg(1).text = "changed"


# --------------------------------------------------------------------------- upcasting

def test_handle_issued_schema_1_upcasts_without_index():
    rec = raw_record("s", 3, "connection.handle_issued", 1, '{"generation":2,"handle":"h-old"}')
    assert rec.event == ev.HandleIssued(2, "h-old", last_consumed_client_message_index=None)
    assert ev.HandleIssued.SCHEMA == 2


def test_upcasting_goes_through_the_registered_upcaster(monkeypatch):
    monkeypatch.setattr(codec, "_UPCASTERS", {})
    with pytest.raises(CorruptEvent, match="no upcaster from schema 1"):
        decode("connection.handle_issued", 1, {"generation": 2, "handle": "h"})


def test_upcasters_chain_from_old_schema_to_current(monkeypatch):
    monkeypatch.setattr(codec, "_CATALOGUE", dict(codec._CATALOGUE))
    monkeypatch.setattr(codec, "_UPCASTERS", dict(codec._UPCASTERS))

    @ev.event_type("test.renamed", schema=3)
    class Renamed(ev.Event):
        call_id: str
        tries: int

    @ev.upcaster("test.renamed", 1)
    def _v1(data):  # schema 1 called it "id"
        data["call_id"] = data.pop("id")
        return data

    @ev.upcaster("test.renamed", 2)
    def _v2(data):  # schema 3 added "tries"
        data.setdefault("tries", 1)
        return data

    assert decode("test.renamed", 1, {"id": "c9"}) == Renamed("c9", 1)
    assert decode("test.renamed", 2, {"call_id": "c9"}) == Renamed("c9", 1)
    assert decode("test.renamed", 3, {"call_id": "c9", "tries": 4}) == Renamed("c9", 4)
    with pytest.raises(ValueError, match="registered twice"):
        ev.event_type("test.renamed")(type("Again", (ev.Event,), {"__annotations__": {}}))


# --------------------------------------------------------------------------- tolerant reader

def test_tolerant_reader_ignores_unknown_fields():
    data = {"reason": "hangup", "added_by_newer_code": {"x": 1}}
    assert decode("session.closed", 1, data) == ev.SessionClosed("hangup")
    rec = raw_record("s", 1, "tool.call_requested", 1, json.dumps(
        {"call_id": "c1", "name": "n", "args": {}, "generation": 1, "priority": "high"}))
    assert rec.event == ev.ToolCallRequested("c1", "n", {}, 1)


def test_a_field_with_a_default_may_be_absent_from_a_row():
    """Fields with a default (a value or a factory) were added after rows were written
    without them: such rows load with the default, they are not "lacking" a field."""
    assert decode("session.opened", 1, {"model": "m", "tools": [], "worker": "w"}) == \
        ev.SessionOpened("m", [], "w", 1, {})
    assert decode("connection.reconnect_requested", 1, {"reason": "settings"}) == \
        ev.ReconnectRequested("settings", [])
    assert decode("anomaly.recorded", 1, {"kind": "k"}) == ev.AnomalyRecorded("k", {}, 0)


# --------------------------------------------------------------------------- what cannot be read

def _names_the_event(err: EventDecodeError, rec, etype: str) -> None:
    assert (err.stream_id, err.version, err.position, err.event_type) == (
        rec.stream_id, rec.version, rec.position, etype)
    text = str(err)
    assert f"{rec.stream_id}@{rec.version}" in text and etype in text


def test_decode_errors_are_session_store_errors():
    for cls in (UnknownEventType, SchemaVersionTooNew, CorruptEvent):
        assert issubclass(cls, EventDecodeError) and issubclass(cls, SessionStoreError)


def test_unknown_event_type_names_stream_version_and_type():
    rec = raw_record("call-7", 4, "tool.call_teleported", 1, '{"call_id":"c1"}', position=40)
    with pytest.raises(UnknownEventType) as err:
        rec.event
    _names_the_event(err.value, rec, "tool.call_teleported")
    assert "newer version" in str(err.value)


def test_schema_version_newer_than_code():
    rec = raw_record("call-7", 2, "connection.handle_issued", 3,
                     '{"generation":1,"handle":"h","last_consumed_client_message_index":1}')
    with pytest.raises(SchemaVersionTooNew) as err:
        rec.event
    _names_the_event(err.value, rec, "connection.handle_issued")
    assert "schema version 3" in str(err.value) and "upgrade the code" in str(err.value)


@pytest.mark.parametrize("payload,why", [
    ('{"role":"user","text":', "not valid JSON"),
    ("[1,2]", "must be a JSON object"),
    ('{"role":"user"}', "lacks field(s) ['text']"),
    ("null", "must be a JSON object"),
])
def test_corrupt_payload(payload, why):
    rec = raw_record("call-7", 5, "conversation.message", 1, payload, position=9)
    with pytest.raises(CorruptEvent) as err:
        rec.event
    _names_the_event(err.value, rec, "conversation.message")
    assert why in str(err.value)
    with pytest.raises(CorruptEvent):  # errors are not cached away
        rec.event


def test_a_payload_nested_deeper_than_python_decodes_is_corrupt():
    """Valid JSON nested 100,000 deep (no writer of ours makes it: the encoder has the same
    limit) raised RecursionError from every reader, a traceback instead of a row named as
    corrupt."""
    deep = "[" * 100_000 + "]" * 100_000
    rec = raw_record("call-7", 5, "conversation.message", 1,
                     '{"role":"user","text":' + deep + "}", position=9)
    with pytest.raises(CorruptEvent) as err:
        rec.event
    _names_the_event(err.value, rec, "conversation.message")
    assert "nested too deeply" in str(err.value)


def test_a_field_of_the_wrong_type_is_named_without_quoting_its_text():
    """The error says which field and what it holds, but never quotes text from it: it is
    printed by every reader (the CLI's error line, verify, the viewer), also under --redact,
    and a transcript or a tool argument is where personal data lives. A number, a bool or
    null is quoted: that is what tells a mistyped field apart, and holds no one's data."""
    rec = raw_record("call-7", 5, "conversation.message", 1,
                     '{"role":"user","text":["Bob Smith, bob@example.com, +44 7700 900123"]}',
                     position=9)
    with pytest.raises(CorruptEvent) as err:
        rec.event
    message = str(err.value)
    assert "field 'text' holds list" in message
    assert "bob@example.com" not in message and "Bob Smith" not in message
    rec = raw_record("call-7", 6, "speech.bot_started", 1, '{"generation":"Bob Smith"}',
                     position=10)
    with pytest.raises(CorruptEvent) as err:
        rec.event
    assert "field 'generation' holds str" in str(err.value)
    assert "Bob" not in str(err.value)
    rec = raw_record("call-7", 7, "speech.bot_started", 1, '{"generation":2.5}', position=11)
    with pytest.raises(CorruptEvent) as err:
        rec.event
    assert "field 'generation' holds float 2.5" in str(err.value)


@pytest.mark.parametrize("etype,payload,field", [
    ("speech.bot_started", '{"generation":true}', "generation"),
    ("session.worker_attached", '{"worker":"w2","epoch":true}', "epoch"),
    ("connection.go_away", '{"generation":1,"time_left_s":false}', "time_left_s"),
])
def test_a_bool_is_not_a_number(etype, payload, field):
    """JSON true is not the integer 1 (though Python's bool is an int): an epoch or a
    generation stored as a bool does not fit its type. Folded, it compared equal to 1."""
    rec = raw_record("call-7", 5, etype, 1, payload, position=9)
    with pytest.raises(CorruptEvent) as err:
        rec.event
    _names_the_event(err.value, rec, etype)
    assert f"field '{field}' holds bool" in str(err.value)


def test_nesting_is_counted_on_brackets_outside_strings():
    from session_store.events import MAX_NESTING, nested_too_deeply

    n = MAX_NESTING
    assert not nested_too_deeply("[" * n + "]" * n)
    assert nested_too_deeply("[" * (n + 1) + "]" * (n + 1))
    assert nested_too_deeply('{"a":' * (n + 1) + "1" + "}" * (n + 1))
    # Brackets in strings, escaped quotes included, do not nest; many siblings do not either.
    assert not nested_too_deeply(json.dumps(["[" * 500, '\\"[[[' * 100, "{" * 300]))
    assert not nested_too_deeply(json.dumps([[[i]] for i in range(1000)]))
    assert nested_too_deeply(json.dumps({"s": "]" * 200, "v": json.loads("[" * (n + 1) +
                                                                         "]" * (n + 1))}))
