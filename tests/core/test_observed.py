"""A decision's logged observation (observed.py): read back exactly, stored once, never more
than the log keeps."""

from __future__ import annotations

import json

from session_store import events as ev
from session_store.decide import (CancellationArrived, FunctionCall, GoAway, HandleArrived,
                                  HandshakeFailed, InteractionStatusObserved, InterruptionObserved,
                                  ModelOutputObserved, OutcomeAnswered, ProgressReturned,
                                  ResultArrived, ResultReturned, SeedAsked, SendFailed,
                                  ServerMessageRejected, SessionLeft, SessionReady,
                                  SettingsUpdate, SpeechStarted, SpeechStopped,
                                  TakenOver, ToolCallsArrived, ToolStopped, TranscriptFlushed,
                                  decide)
from session_store.events import canonical_json
from session_store.observed import (OBSERVATION_KINDS, Unreplayable, observation_of,
                                    observation_record)
from session_store.outcomes import CannotTell, Done, NotAnAnswer
from session_store.policy import Policy
from session_store.projection import fold
from session_store.state import SessionState

from .helpers import T0_US, record

SECRET_ARGS = {"order": "A-77", "note": "n" * 400}


def stored(e: ev.Event) -> ev.Event:
    return ev.decode(e.TYPE, e.SCHEMA, json.loads(canonical_json(e.to_data())))


def state_of(*events: ev.Event, model: str = "gemini-live") -> SessionState:
    return fold(record("s", [ev.SessionOpened(model, ["lookup"], "w1"), *events]))


def logged(state: SessionState, obs, policy: Policy | None = None, now_us: int | None = None):
    """What the driver appends for `obs` (record, events), and it read back from storage."""
    decided = decide(state, obs, policy or Policy(), now_us)
    rec = observation_record(obs, decided, state)
    text = canonical_json(rec.to_data())
    back = stored(rec)
    assert isinstance(back, ev.ObservationRecorded)
    return text, back, [stored(e) for e in decided]


CONNECTED = ev.Connected(1, "h1", "ab" * 32)
RUNNING = [CONNECTED, ev.ToolCallRequested("c1", "lookup", {"id": 1}, 1),
           ev.ToolCallStarted("c1", 1, "s:c1", 1)]

# Every kind of observation, on a state where it decides something.
CASES = [
    ([CONNECTED], ToolCallsArrived((FunctionCall("c1", "lookup", SECRET_ARGS,
                                                 declared="BLOCKING"),
                                    FunctionCall("c2", "nosuch", {"x": 1},
                                                 has_handler=False)), 1)),
    ([CONNECTED], SpeechStarted(1, "transport")),
    ([CONNECTED, ev.BotStartedSpeaking(1)], SpeechStopped(1, "interruption")),
    ([CONNECTED], InterruptionObserved(1)),
    ("gemini-3.8-flash-thinking-live", InteractionStatusObserved(1, "IN_PROGRESS")),
    ([CONNECTED], SettingsUpdate(("voice",), {"voice": "Puck"})),
    ([CONNECTED], CancellationArrived(("c9",), 1)),
    ([CONNECTED], GoAway(1, 30.0, 1000)),
    ([CONNECTED], ServerMessageRejected("malformed_message", {"frame": "{bad"}, 1)),
    ([], SessionReady(1, None, "ab" * 32, transport_playing=True)),
    ([ev.HandleIssued(1, "h1")], SessionReady(2, "h1", "cd" * 32)),
    ([CONNECTED], SessionLeft(1, "go_away", transport_playing=True)),
    (RUNNING, ToolStopped("c1", frozenset())),
    ([CONNECTED, ev.HandleIssued(1, "h1"), ev.Disconnected(1, "error")],
     HandshakeFailed("h1", "1008 None. Requested entity was not found.", 1008,
                     "Requested entity was not found.")),
    ([CONNECTED, ev.HoldsAll(1)], HandleArrived(1, "h2", 4)),
    ([CONNECTED, ev.SendUnread(1)], HandleArrived(1, "h2", 4)),  # withheld (index unkept)
    (RUNNING, ResultReturned("c1", (ev.ToolCallCompleted("c1", {"rows": SECRET_ARGS}),))),
    ([CONNECTED, ev.ToolCallRequested("c1", "track", {}, 1, "non_blocking"),
      ev.ToolCallStarted("c1", 1, "s:c1", 1)], ProgressReturned("c1", {"at": "depot"}, "SILENT")),
    (RUNNING, ResultArrived("c1", "lookup", {"rows": SECRET_ARGS})),
    (RUNNING + [ev.WorkerAttached("w2", 2)], OutcomeAnswered("c1", Done({"rows": [1, 2]}))),
    (RUNNING + [ev.WorkerAttached("w2", 2)], OutcomeAnswered("c1", CannotTell("timed out"))),
    (RUNNING + [ev.WorkerAttached("w2", 2)], OutcomeAnswered("c1", NotAnAnswer("'yes'"))),
    ([CONNECTED], SendFailed(1, "result", False, "RuntimeError: the socket is wedged")),
    ([CONNECTED], TranscriptFlushed(1, (("Refund", None), (" it?", 0.5)), "Done.", 0.5)),
    ([CONNECTED, ev.ConversationMessage("assistant", "Your order A-77 is refunded.", 1)],
     InterruptionObserved(1, local=True, finished_turn_heard=0.5)),
    ([ev.ConversationMessage("user", "hi"), ev.Connected(1)], SeedAsked(1, True, True)),
    ([CONNECTED, ev.SendUnread(1)], ModelOutputObserved(1, reaction=True)),
    ([CONNECTED, ev.SendUnread(1, True)], ModelOutputObserved(1, True, turn_ended=True)),
    ([CONNECTED], TranscriptFlushed(1, (), "Done.", None, 0.8, T0_US)),
    ([CONNECTED, ev.ConversationMessage("assistant", "Your order A-77 is refunded.", 1,
                                        audio_s=2.0, audio_from_us=T0_US),
      ev.WorkerAttached("w2", 2)], TakenOver(0.24)),
]
#: When the observations are decided (a takeover's cut depends on it).
NOW_US = T0_US + 500_000


def test_every_kind_of_observation_is_read_back_exactly():
    assert {type(obs).__name__ for _, obs in CASES} == set(OBSERVATION_KINDS)
    for before, obs in CASES:
        state = (state_of(CONNECTED, model=before) if isinstance(before, str)
                 else state_of(*before))
        _, back, decided = logged(state, obs, now_us=NOW_US)
        assert decided, f"{obs} decides something here"
        assert back.kind == type(obs).__name__ and back.events == len(decided)
        rebuilt, not_logged = observation_of(back, decided)
        assert rebuilt == obs and not not_logged
        assert decide(state, rebuilt, Policy(), NOW_US) == decide(state, obs, Policy(), NOW_US)


def test_what_the_decided_events_hold_is_referenced_not_copied():
    for before, obs in CASES:
        if isinstance(before, str):
            continue
        text, back, _ = logged(state_of(*before), obs, now_us=NOW_US)
        assert "A-77" not in text and "nnnn" not in text and "Puck" not in text \
            and "depot" not in text, text
    _, back, _ = logged(state_of(ev.HandleIssued(1, "h1")), SessionReady(2, "h1", "cd" * 32))
    assert back.refs == {"handle": [0, "handle"], "prompt_sha256": [0, "system_instruction_sha256"]}
    assert "h1" not in json.dumps(back.data)  # the handle is stored once, where redaction knows it
    for gate in (ev.HoldsAll(1), ev.SendUnread(1)):  # issued, withheld
        _, back, _ = logged(state_of(CONNECTED, gate), HandleArrived(1, "h-secret", 4))
        assert "h-secret" not in json.dumps(back.data) and back.refs["handle"] == [0, "handle"]


def test_a_stopped_call_keeps_only_the_wire_ids_that_name_it():
    state = state_of(*RUNNING)
    many = {f"other{i}" for i in range(100)}
    _, back, decided = logged(state, ToolStopped("c1", many))
    assert back.data["wire_ids"] == []
    rebuilt, _ = observation_of(back, decided)
    assert decide(state, rebuilt, Policy()) == decided


def test_arguments_the_log_does_not_keep_are_not_logged_and_read_back_as_stand_ins():
    state = state_of(CONNECTED)
    big = {"blob": "b" * 5000}
    obs = ToolCallsArrived((FunctionCall("c1", "lookup", big),
                            FunctionCall("c2", "lookup", {"x": float("nan")})), 1)
    policy = Policy(max_args_bytes=1000)
    text, back, decided = logged(state, obs, policy)
    assert "bbbb" not in text
    rebuilt, not_logged = observation_of(back, decided)
    assert not_logged == {"c1", "c2"}
    again = decide(state, rebuilt, policy)
    assert [(e.TYPE, getattr(e, "kind", None)) for e in again] == \
        [(e.TYPE, getattr(e, "kind", None)) for e in decided]


def test_an_observation_the_log_cannot_store_is_withheld_and_says_so():
    state = state_of(CONNECTED)
    obs = CancellationArrived(("bad\udcff",), 1)
    decided = decide(state, obs, Policy())
    rec = observation_record(obs, decided, state)
    assert rec.withheld and rec.data == {} and rec.events == len(decided)
    canonical_json(rec.to_data())  # storable
    try:
        observation_of(rec, decided)
    except Unreplayable as exc:
        assert "surrogates" in str(exc) or exc.args[0]
    else:
        raise AssertionError("a withheld observation cannot be read back")


def test_the_fold_ignores_it():
    decided = [ev.BotStartedSpeaking(1)]
    rec = observation_record(SpeechStarted(1), decided, state_of(CONNECTED))
    with_it = state_of(CONNECTED, rec, *decided)
    without = state_of(CONNECTED, *decided)
    assert with_it.bot_speaking and without.bot_speaking
    assert with_it.calls == without.calls and with_it.generation == without.generation


def test_a_result_value_the_log_does_not_keep_reads_back_to_the_same_decision():
    """A value the log cannot store is kept as its problem only; a value its call did not take
    (an unknown id, a second result, a dropped intermediate result) is not kept at all."""
    from session_store.storable import Unstorable
    nb = [CONNECTED, ev.ToolCallRequested("c2", "track", {}, 1, "non_blocking"),
          ev.ToolCallStarted("c2", 1, "s:c2", 1)]
    done = RUNNING + [ev.ToolCallCompleted("c1", {"ok": 1})]
    in_doubt = RUNNING + [ev.WorkerAttached("w2", 2)]
    for before, obs in (
            (RUNNING, ResultArrived("c1", "lookup", {"v": float("nan"), "n": SECRET_ARGS})),
            (RUNNING, ResultArrived("c1", "lookup", Unstorable("RecursionError: deep", "[["))),
            (RUNNING, ResultArrived("zz", "lookup", {"rows": SECRET_ARGS})),
            (done, ResultArrived("c1", "lookup", {"rows": SECRET_ARGS})),
            (RUNNING, ProgressReturned("c1", {"rows": SECRET_ARGS}, "SILENT", "lookup")),
            (nb, ProgressReturned("c2", {"v": float("nan")}, "SILENT", "track")),
            # An outcome check's Done whose result the log cannot store: the same rule.
            (in_doubt, OutcomeAnswered("c1", Done({"v": float("nan"), "n": SECRET_ARGS}))),
            (in_doubt, OutcomeAnswered("c1", Done(Unstorable("RecursionError: deep", "[[")))),
            (done, OutcomeAnswered("c1", Done({"v": float("nan"), "n": SECRET_ARGS})))):
        state = state_of(*before)
        text, back, decided = logged(state, obs)
        assert "A-77" not in text, text
        rebuilt, _ = observation_of(back, decided)
        # (as replay compares them: an anomaly by its kind, its details are diagnostics)
        assert as_replayed(decide(state, rebuilt, Policy())) == as_replayed(decided), obs


def as_replayed(events: list[ev.Event]) -> list:
    return [e.kind if isinstance(e, ev.AnomalyRecorded) else e for e in events]


def test_a_failed_handshake_logged_before_its_close_code_reads_back_and_decides_as_then():
    """Logs before the close code hold the shell's verdict (`refused`) and no code."""
    state = state_of(CONNECTED, ev.HandleIssued(1, "h1"), ev.Disconnected(1, "error"))
    decided = [ev.AnomalyRecorded("handshake_failed", {"handle": "h1"}, 1),
               ev.HandleRefused(1, "h1", "refused", 1)]
    record = ev.ObservationRecorded("HandshakeFailed", {
        "handle": "h1", "refused": True, "error": "1008 None. Not found."}, 2, {})
    rebuilt, _ = observation_of(stored(record), decided)
    assert rebuilt == HandshakeFailed("h1", "1008 None. Not found.", refused=True)
    assert as_replayed(decide(state, rebuilt, Policy())) == as_replayed(decided)
