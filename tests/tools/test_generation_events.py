"""How the timeline shows what is particular to Gemini 3.x calls: a call's mode and
scheduling, intermediate results and their sends, the model's interaction status, a prompt
change applied in-session by contextUpdate, and what a seed or a catch-up covered."""

from __future__ import annotations

from rich.console import Console

from session_store import events as ev
from session_store.audit.text import timeline_view
from session_store.audit.timeline import build_timeline

from .helpers import chain

THINKING = "gemini-3.8-live-extended-thinking"


def a_3_x_call() -> list[tuple[float, ev.Event]]:
    return [
        (0, ev.SessionOpened(THINKING, ["track"], "w1", 1, {"model": THINKING})),
        (0, ev.Connected(1)),
        (10, ev.ConversationMessage("user", "Where is my parcel?", 0)),
        (11, ev.ConversationSending(1, 3, "seed")), (12, ev.ConversationSent(1, 3, "seed")),
        (20, ev.InteractionStatus(1, "IN_PROGRESS")),
        (30, ev.ToolCallRequested("c1", "track", {"id": 9}, 1, "non_blocking")),
        (31, ev.ToolCallStarted("c1", 1, "r:c1", 1)),
        (40, ev.ToolCallProgress("c1", 1, {"step": 1}, "SILENT")),
        (41, ev.ToolResultSending("c1", 1, "tool_response", 1)),
        (42, ev.ToolResultSent("c1", 1, "tool_response", 1)),
        (50, ev.SettingsChanged(["system_instruction"], {"system_instruction": "Be terse."},
                                False, True)),
        (51, ev.ContextSending(1, 13)), (52, ev.ContextSent(1, 13)),
        (60, ev.ToolCallCompleted("c1", {"at": "depot"}, scheduling="WHEN_IDLE")),
        (61, ev.ToolResultSending("c1", 1, "tool_response")),
        (62, ev.ToolResultSent("c1", 1, "tool_response")),
        (70, ev.InteractionStatus(1, "IDLE", "timeout")),
    ]


def test_the_timeline_says_what_a_3_x_call_did():
    tl = build_timeline(chain("g3", a_3_x_call()), call_id="g3")
    text = {e.version: e.summary for e in tl.entries}
    assert "NON_BLOCKING" in text[7]
    assert "intermediate result 1" in text[9] and "SILENT" in text[9]
    assert "intermediate result 1 sent via tool_response" in text[11]
    assert "applied in-session (contextUpdate)" in text[12]
    assert "contextUpdate" in text[13] and "v13" in text[13]
    assert "(WHEN_IDLE)" in text[15]
    assert "interaction status IN_PROGRESS" in text[6]
    assert "taken as idle" in text[18]
    assert "seeding it with the conversation" in text[4]
    call = tl.tool_calls["c1"]
    assert (call.mode, call.scheduling) == ("non_blocking", "WHEN_IDLE")
    assert [(p["part"], p["sent_via"]) for p in call.progress] == [(1, "tool_response")]
    # The outcome's sends are its own: the intermediate result's is not counted as one.
    assert [(s.via, s.version) for s in call.sends] == [("tool_response", 16)]
    assert not tl.problems
    console = Console(width=200, record=True)
    console.print(timeline_view(tl))
    assert "interaction status IN_PROGRESS" in console.export_text()
