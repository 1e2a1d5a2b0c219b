"""I1–I9, checked against three independent records of one call.

- the local server's record: what Gemini actually received, on which connection (absent
  for a live call against the real API: then the log and the ledger are checked);
- the tool ledger: every side effect a tool performed, written by the tool itself;
- the event log: what the service recorded (and its hash chains).
Each check returns readable violation strings; an empty list means the call was right.
"""

from __future__ import annotations

import json
from collections import defaultdict

from session_store.projection import fold_into
from session_store import Policy
from session_store import events as ev
from session_store.audit import replay
from session_store.delivery import unanswered, undelivered_parts
from session_store.lineage import in_model
from session_store.state import SessionState


def check_call(scenario, records, reports, server, ledger: list[dict]) -> list[str]:
    problems: list[str] = []
    problems += _check_log(scenario, records, reports)
    if server is not None:
        problems += _check_server(scenario, server, records)
    problems += _check_ledger(scenario, ledger, records)
    problems += check_answers(scenario, records, ledger)
    problems += check_replayed(scenario, records)
    return problems


def policy_of(scenario) -> Policy:
    """The policy a scenario's service decides with (its tools' outcome checks included)."""
    return Policy(idempotent=scenario.idempotent, rerun_if_not_done=(
        scenario.checked if scenario.rerun_if_not_done else frozenset()))


def check_replayed(scenario, records) -> list[str]:
    """I9: every decision the log holds is decided again by replay, to the same events."""
    report = replay(records, policy_of(scenario))
    out = [f"I9: replay stopped: {report.error}"] if report.error else []
    # (A log made by hand for a checker test predates decision.observed: it is replayed by
    # reconstruction; tests/crash/test_replay_coverage.py holds real calls to full coverage.)
    if report.decisions_logged and (report.reconstructed or report.not_replayed):
        out.append(f"I9: replay coverage: {report.coverage}")
    out += [f"I9: v{d.version}-{d.to_version} decided otherwise on replay: {d.message}"
            for d in report.divergences if d.kind == "decide"]
    return out


def _check_log(scenario, records, reports) -> list[str]:
    out: list[str] = []
    # I7: gap-free versions and a verified hash chain.
    if [r.version for r in records] != list(range(1, len(records) + 1)):
        out.append("I7: versions are not gap-free")
    out += [f"I7: chain broken at version {r.first_bad_version}: {r.reason}"
            for r in reports if not r.ok]
    state = SessionState(stream_id=records[0].stream_id if records else "")
    for rec in records:
        e = rec.event
        # I4: no blocking tool starts while the bot speaks (a NON_BLOCKING one is not
        # deferred by default: the model talks while it runs); deferred calls start in
        # request order.
        if isinstance(e, ev.ToolCallStarted) and e.attempt == 1:
            call = state.calls.get(e.call_id)
            if state.bot_speaking and (call is None or call.mode == "blocking"):
                out.append(f"I4: {e.call_id} started while the bot was speaking (v{rec.version})")
            earlier = [c.call_id for c in state.pending()]
            if earlier and earlier[0] != e.call_id:
                out.append(f"I4: {e.call_id} started before earlier deferred {earlier[0]}")
        # I5: a settings reconnect never cuts a turn, and comes after deferred calls start.
        if isinstance(e, ev.Disconnected) and e.reason == "settings":
            if not state.idle:
                out.append(f"I5: settings reconnect while the bot was speaking or the model "
                           f"still working (v{rec.version})")
            if state.pending():
                out.append(f"I5: settings reconnect before deferred calls started (v{rec.version})")
        # I6: every start is made by the worker holding the newest epoch.
        if isinstance(e, ev.ToolCallStarted) and e.epoch != state.epoch:
            out.append(f"I6: {e.call_id} started by epoch {e.epoch} while epoch {state.epoch} "
                       f"owned the call (v{rec.version})")
        if isinstance(e, ev.WorkerAttached) and e.epoch <= state.epoch:
            out.append(f"I6: worker attached with non-increasing epoch {e.epoch}")
        # I3: an outcome comes from the run that had it. Only the worker that started a call
        # can know its result (fencing stops it once a newer one attached); a newer worker
        # finds the call in doubt and re-runs it (idempotent: a new start) or says "outcome
        # unknown". A success, or a plain failure, logged by another epoch was made up.
        # (Not checked before: a takeover telling the model an in-doubt call succeeded
        # passed every boundary.)
        if isinstance(e, (ev.ToolCallCompleted, ev.ToolCallFailed)) \
                and e.call_id in state.calls:
            call = state.calls[e.call_id]
            made_up = (isinstance(e, ev.ToolCallCompleted) and e.reused_from is None
                       and call.started_epoch != state.epoch) or (
                isinstance(e, ev.ToolCallFailed) and not e.outcome_unknown
                and call.started_epoch not in (None, state.epoch))
            # (Unless the tool's outcome check said what became of it: I8.)
            if made_up and call.checked is None:
                ran = f"epoch {call.started_epoch}" if call.started_epoch else "nobody"
                out.append(f"I3: {e.call_id} ({call.name}) got an outcome from epoch "
                           f"{state.epoch}, but {ran} ran it (v{rec.version})")
        if isinstance(e, ev.ToolCallCompleted) and e.reused_from is not None:
            earlier = state.calls.get(e.reused_from)
            if earlier is None or earlier.status != "completed" or earlier.result != e.result:
                out.append(f"I3: {e.call_id} answered from {e.reused_from}, whose recorded "
                           f"result differs (v{rec.version})")
        out += _check_outcome_check(scenario, state, rec)
        fold_into(state, [rec])
    # I1: every call asked for ended delivered (result or failure) or cancelled, and every
    # intermediate result logged before a call's outcome reached the model.
    out += [f"I1: call {c.call_id} ({c.name}) is {c.status}, not delivered"
            for c in unanswered(state)]
    out += [f"I1: intermediate result {part} of {c.call_id} ({c.name}) never reached the model"
            for c, part in undelivered_parts(state) if part]
    required = scenario.tool_names if scenario.every_tool_required else []
    for name in required:
        if not any(c.name == name and c.has_outcome and in_model(state, c)
                   for c in state.calls.values()):
            out.append(f"I1: no result of {name} reached the model")
    if not required and not any(c.has_outcome and in_model(state, c)
                                for c in state.calls.values()):
        out.append("I1: no tool result reached the model (did the model call any tool?)")
    return out


def _check_outcome_check(scenario, state: SessionState, rec) -> list[str]:
    """I8: a call in doubt whose tool has an outcome check is answered from what the check
    said: never "outcome unknown" where it knew (done or not done), never without asking."""
    e = rec.event
    if not (isinstance(e, ev.ToolCallFailed) and e.outcome_unknown) or e.call_id not in state.calls:
        return []
    call = state.calls[e.call_id]
    if call.name not in getattr(scenario, "checked", ()) or call.status != "started":
        return []  # (a call stopped by pipecat's timeout is another story)
    if call.checked in ("done", "not_done"):
        return [f"I8: {e.call_id} ({call.name}) answered 'outcome unknown' though its check "
                f"said {call.checked} (v{rec.version})"]
    if call.checked is None:
        return [f"I8: {e.call_id} ({call.name}) answered 'outcome unknown' without asking its "
                f"outcome check (v{rec.version})"]
    return []


def check_answers(scenario, records, ledger: list[dict]) -> list[str]:
    """I8 against the ledger: what each check said is what the ledger holds for the key
    (done: a run with that key before the check; not done: none)."""
    out: list[str] = []
    state = SessionState(stream_id=records[0].stream_id if records else "")
    for rec in records:
        e = rec.event
        if isinstance(e, ev.ToolOutcomeChecked) and e.call_id in state.calls:
            call = state.calls[e.call_id]
            ran = any(x["tool"] == call.name and x["idempotency_key"] == call.idempotency_key
                      for x in ledger)
            if e.answer == "done" and not ran:
                out.append(f"I8: the check said {e.call_id} was done; the ledger has no run")
            if e.answer == "not_done" and ran and not _ran_after(ledger, call, rec):
                out.append(f"I8: the check said {e.call_id} was not done; the ledger has a run")
        fold_into(state, [rec])
    return out


def _ran_after(ledger: list[dict], call, rec) -> bool:
    """A run of the call with its key after the check (a re-run it allowed)."""
    at = rec.recorded_at_us / 1e6
    return any(x["tool"] == call.name and x["idempotency_key"] == call.idempotency_key
               and x.get("at", 0) >= at for x in ledger)


def _check_server(scenario, server, records) -> list[str]:
    out = [f"I2: server flagged {v['kind']} on connection {v['connection']} for "
           f"{v.get('id')}: {v.get('detail')}" for v in server.violations
           if v["kind"] != "wait_timeout"]
    out += [f"server error: {e}" for e in server.errors]
    # Every session the log says connected had its setup answered by this server; one it
    # never saw (the worker talked to something else) was checked against nothing.
    logged = sum(isinstance(r.event, ev.Connected) for r in records)
    seen = sum(c.setup is not None for c in server.connections)
    if logged > seen:
        out.append(f"server: the log has {logged} connected sessions, the server saw {seen}")
    # I1 as the model sees it: the last session holds a result for every logical call.
    if server.connections:
        last = server.connections[-1]
        missing = [n for n in scenario.tool_names if n not in last.state.answered_names()]
        out += [f"I1: the model's final state lacks the result of {n}" for n in missing]
        # A call it issued and nobody answered leaves the model waiting (the bot silent),
        # even if it holds a result of that tool: by name alone, a repeated call dropped
        # without a trace in the log passed.
        out += [f"I1: the model still waits for {cid} ({last.state.issued[cid]}) on the last "
                f"connection" for cid in last.state.outstanding()]
        # (The model state's prompt: a setup's, or a contextUpdate's; a resumed session
        # keeps its handle's whatever its setup says.)
        if scenario.new_prompt and last.state.system_instruction != scenario.new_prompt:
            out.append(f"prompt: the last session runs with "
                       f"{last.state.system_instruction!r}, not the new prompt")
    return out


def _check_ledger(scenario, ledger: list[dict], records) -> list[str]:
    """I3: a tool runs at most once per logical call, unless idempotent (then one key).

    A logical call is a tool and its arguments: an equivalent call asked again (after a
    resume, under a new id) is answered from the record, never run again."""
    out: list[str] = []
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for entry in ledger:
        runs[(entry["tool"], json.dumps(entry.get("args"), sort_keys=True))].append(entry)
    for (name, _), entries in runs.items():
        if len(entries) <= 1:
            continue
        if name not in scenario.idempotent:
            out.append(f"I3: non-idempotent {name} ran {len(entries)} times")
        elif len({e["idempotency_key"] for e in entries}) != 1:
            out.append(f"I3: idempotent {name} re-ran with different keys")
    # Write-ahead: a run starts only once its start is in the log, so no call ran more often
    # than the log started it. (A run the log does not know of is run again after a crash;
    # for an idempotent tool the key check above cannot see it.)
    starts: dict[str, int] = defaultdict(int)
    for rec in records:
        if isinstance(rec.event, ev.ToolCallStarted):
            starts[rec.event.call_id] += 1
    ran: dict[str, int] = defaultdict(int)
    for entry in ledger:
        ran[entry["call_id"]] += 1
    out += [f"I3: {call_id} ran {n} times but its start was logged {starts[call_id]} times "
            f"(a run ahead of its start's commit)"
            for call_id, n in ran.items() if n > starts[call_id]]
    # And the other way: a result not reused from the record came from a run (_check_log
    # checks that its own worker logged it), which wrote its ledger line first. A ledger
    # missing runs (not written, or not where it is read) passed every I3 check above.
    out += [f"I3: {rec.event.call_id} has a result, but the ledger has no run of it "
            f"(v{rec.version})" for rec in records
            if isinstance(rec.event, ev.ToolCallCompleted) and rec.event.reused_from is None
            and not ran[rec.event.call_id]]
    return out
