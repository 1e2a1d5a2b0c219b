"""How tool-call events are shown: each updates its call's view (request, start, outcome,
sends) and returns its one-line summary. `kinds.KINDS` lists them with their lanes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...records import RecordedEvent
from ..fmt import clip, ms, words
from .draft import TimelineDraft, bounded
from .entries import Send, ToolCallView


def _tool(render: Callable[[TimelineDraft, RecordedEvent, dict, ToolCallView, str], Any]):
    """A tool event's renderer: the call it names, or a problem when it names none."""
    def run(b: TimelineDraft, rec, d):
        cid = d.get("call_id")
        if not isinstance(cid, str):
            b.problem(rec, "tool_event_without_call_id", bounded(d))
            return f"{rec.type} without a call id", "error"
        return render(b, rec, d, b.call(cid), cid)
    return run


@_tool
def requested(b, rec, d, c: ToolCallView, cid):
    c.name, c.args, c.generation = d.get("name"), d.get("args"), d.get("generation")
    c.requested_version, c.requested_at_us, c.clipped = rec.version, rec.recorded_at_us, False
    c.mode = d.get("mode") if isinstance(d.get("mode"), str) else "blocking"
    mode = " (NON_BLOCKING: the model goes on talking)" if c.mode == "non_blocking" else ""
    return (f"{cid}: {words(c.name)}({clip(c.args, 80)}) requested on generation "
            f"{words(c.generation)}{mode}")


@_tool
def progress(b, rec, d, c, cid):
    c.progress.append({"part": d.get("part"), "result": d.get("result"),
                       "scheduling": d.get("scheduling"), "at_us": rec.recorded_at_us,
                       "sent_via": None, "sent_generation": None, "sent_at_us": None})
    how = f", {words(d.get('scheduling'))}" if d.get("scheduling") else ""
    return (f"{cid}: intermediate result {words(d.get('part'))}{how}: "
            f"{clip(d.get('result'), 80)}")


@_tool
def reissued(b, rec, d, c, cid):
    orig = b.call(d.get("original")) if isinstance(d.get("original"), str) else None
    c.reissue_of = d.get("original")
    if orig is not None:
        orig.superseded_by = cid
        b.inherit(orig)
    return (f"{cid}: Gemini asked again for {words(d.get('original'))} (same tool and "
            "arguments); it gets that call's outcome, the tool does not run twice")


@_tool
def deferred(b, rec, d, c, cid):
    c.deferred = True
    return f"{cid}: deferred until the bot stops speaking"


@_tool
def started(b, rec, d, c, cid):
    t = rec.recorded_at_us
    c.attempts.append({"attempt": d.get("attempt"), "version": rec.version, "at_us": t,
                       "epoch": d.get("epoch"), "idempotency_key": d.get("idempotency_key")})
    if c.started_at_us is None:
        c.started_at_us, c.wait_ms = t, ms(c.requested_at_us, t)
    waited = f" after waiting {c.wait_ms:.0f} ms" if c.wait_ms is not None else ""
    again = f" (attempt {words(d.get('attempt'))})" if d.get("attempt", 1) != 1 else ""
    return f"{cid}: {words(c.name) if c.name else 'tool'} started{again}{waited}"


@_tool
def completed(b, rec, d, c, cid):
    c.outcome, c.result, c.reused_from = "completed", d.get("result"), d.get("reused_from")
    c.finished_version, c.finished_at_us = rec.version, rec.recorded_at_us
    orig = b.tl.tool_calls.get(c.reused_from) if isinstance(c.reused_from, str) else None
    if orig is not None and not orig.superseded_by:  # as the projection links them
        c.reissue_of, orig.superseded_by = c.reused_from, cid
    if c.reused_from:
        return (f"{cid}: answered from the recorded result of {words(c.reused_from)} "
                f"(not run again): {clip(c.result, 80)}")
    c.run_ms = ms(c.attempts[-1]["at_us"] if c.attempts else c.started_at_us,
                  rec.recorded_at_us)
    c.scheduling = d.get("scheduling")
    b.inherit(c)
    ran = f" in {c.run_ms:.0f} ms" if c.run_ms is not None else ""
    how = f" ({words(c.scheduling)})" if c.scheduling else ""
    return f"{cid}: completed{ran}{how}: {clip(c.result, 80)}"


@_tool
def failed(b, rec, d, c, cid):
    c.outcome, c.error = "failed", d.get("error")
    c.outcome_unknown = bool(d.get("outcome_unknown"))
    c.finished_version, c.finished_at_us = rec.version, rec.recorded_at_us
    c.run_ms = ms(c.attempts[-1]["at_us"] if c.attempts else c.started_at_us,
                  rec.recorded_at_us)
    b.inherit(c)
    b.problem(rec, "tool_failed", {"tool_call_id": cid, "error": bounded(c.error),
                                   "outcome_unknown": c.outcome_unknown})
    unknown = " (outcome unknown: in doubt after a crash)" if c.outcome_unknown else ""
    return f"{cid}: failed{unknown}: {clip(c.error, 80)}", "error"


#: What an outcome check's answer means, as the timeline says it.
CHECK_ANSWERS = {"done": "it was done (the model gets its result)",
                 "not_done": "it was not done",
                 "cannot_tell": "it cannot tell (the model hears: outcome unknown)"}


@_tool
def checked(b, rec, d, c, cid):
    answer = d.get("answer")
    what = CHECK_ANSWERS.get(answer) if isinstance(answer, str) else None
    detail = f": {clip(d.get('detail'), 80)}" if d.get("detail") else ""
    return (f"{cid}: in doubt after a crash; its outcome check says "
            f"{what or words(answer)}{detail}"), "info" if answer != "cannot_tell" else "warn"


@_tool
def cancelled(b, rec, d, c, cid):
    c.outcome, c.cancel_reason = "cancelled", d.get("reason")
    c.finished_version, c.finished_at_us = rec.version, rec.recorded_at_us
    return f"{cid}: cancelled ({words(d.get('reason'))})", "warn"


@_tool
def sending(b, rec, d, c, cid):
    if d.get("part"):
        return (f"{cid}: sending intermediate result {words(d.get('part'))} via "
                f"{words(d.get('via'))} on generation {words(d.get('generation'))}")
    c.sends.append(Send(d.get("generation"), d.get("via"), rec.version, rec.recorded_at_us))
    return (f"{cid}: sending result via {words(d.get('via'))} on generation "
            f"{words(d.get('generation'))}")


@_tool
def sent(b, rec, d, c, cid):
    t = rec.recorded_at_us
    if d.get("part"):
        part = next((p for p in c.progress if p["part"] == d.get("part")), None)
        if part is not None and part["sent_at_us"] is None:
            part.update(sent_via=d.get("via"), sent_generation=d.get("generation"), sent_at_us=t)
        return (f"{cid}: intermediate result {words(d.get('part'))} sent via "
                f"{words(d.get('via'))} on generation {words(d.get('generation'))}")
    for s in reversed(c.sends):
        if s.generation == d.get("generation") and not s.confirmed:
            break
    else:
        s = Send(d.get("generation"), d.get("via"), rec.version, t)
        c.sends.append(s)
    s.confirmed, s.confirmed_version, s.confirmed_at_us = True, rec.version, t
    first = c.sent_at_us is None
    if first:
        c.sent_at_us, c.sent_via, c.sent_generation = t, d.get("via"), d.get("generation")
        c.send_ms = ms(c.finished_at_us, t)
    after = f", {c.send_ms:.0f} ms after the outcome" if (
        first and c.send_ms is not None) else ""
    again = "" if first else " (sent again)"
    return (f"{cid}: result sent via {words(d.get('via'))} on generation "
            f"{words(d.get('generation'))}{after}{again}")
