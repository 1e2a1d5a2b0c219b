"""The handles' gate is folded from the log: a worker that takes over sees it as its
predecessor left it, and `replay` decides every handle again.

The gate (which sends the model has not been seen to read, session_store.withholding) was
each worker's memory: a new worker started from an empty one, and replay could not tell why
a handle was withheld. Now the service logs what it sees (a send the model has not read, the
model's reaction, a session that holds everything) and a handle arriving is decided on the
gate the fold builds (decide.HandleArrived). Real pipelines, real google-genai client, the
local Gemini Live server, two services on one database.
"""

from __future__ import annotations

import pytest

from service.local_live import Audio, ResumptionUpdate, Script, Sleep, TurnComplete
from session_store.audit import replay
from session_store.audit.replay import logged_decisions
from session_store.state import Withholding

from .helpers import CallRun, Ctl, assert_server_clean, run_call

pytestmark = pytest.mark.timeout(90)

#: The old worker's session once its seed went out and a handle crossed it: the seed unread.
SEED_UNREAD = Withholding(holds_sends=0, unread_send=1, turn_at_send=False)


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_worker_that_takes_over_sees_the_gate_its_predecessor_left(flavour):
    # The old worker's session: a handle crosses the seed at once, then the model says
    # nothing (it has not reacted to the seed) until the call is taken over.
    old_scripts = [Script([ResumptionUpdate(), Sleep(20)], reply=(),
                          resumption_after_turn=False)]
    # The new worker's session: fresh (the log has no issued handle), a handle crosses its
    # seed too, then the model answers and issues one after its turn.
    new_scripts = [Script([ResumptionUpdate(), Audio(chunks=2), TurnComplete()], reply=())]
    taken_over: list[CallRun] = []
    seen: dict[str, object] = {}

    def look_at_attach(llm) -> None:
        """What the new worker folds from the log when it attaches, before it does anything."""
        attach = llm.driver.attach

        async def attach_and_look(**kwargs):
            state = await attach(**kwargs)
            seen["gate"] = state.withholding
            return state

        llm.driver.attach = attach_and_look

    async def old_worker(ctl: Ctl):
        driver = ctl.llm.driver
        assert await ctl.wait(lambda: bool(ctl.server.handles), timeout=10)
        for _ in range(100):  # until the handle is logged (a lazy note's commit)
            if any(r.type == "connection.handle_withheld"
                   for r in await flavour.store.read(ctl.llm.call_id)):
                break
            await ctl.settle(0.05)
        else:
            raise AssertionError("the handle that crossed the seed was never logged")
        seen["old_gate"] = driver.state.withholding

        async def new_worker(ctl2: Ctl):
            await ctl2.wait(lambda: ctl2.script_done(0) and not ctl2.tap.speaking, timeout=12)
            # (the handle after the turn, logged as issued)
            assert await ctl2.wait(lambda: bool(ctl2.llm.driver.state.handles), timeout=8)
            await ctl2.settle()

        taken_over.append(await run_call(flavour, new_scripts, new_worker,
                                         call_id=ctl.llm.call_id,
                                         server_handles=dict(ctl.server.handles),
                                         prepare=look_at_attach))

    old = await run_call(flavour, old_scripts, old_worker)
    new, = taken_over

    early = next(iter(old.server.handles))
    assert seen["old_gate"] == SEED_UNREAD, seen
    # The new worker folds the gate its predecessor left (its own memory started empty).
    assert seen["gate"] == SEED_UNREAD, seen

    withheld = [(e.data["generation"], e.data["handle"]) for e in
                new.find("connection.handle_withheld")]
    issued = [(e.data["generation"], e.data["handle"]) for e in
              new.find("connection.handle_issued")]
    assert withheld[0] == (1, early) and [g for g, _h in withheld] == [1, 2], new.timeline()
    assert [g for g, _h in issued] == [2], new.timeline()  # after the model's reaction
    assert new.find("connection.connected", generation=2)[0].data["handle"] is None
    assert [(e.type, e.data["generation"]) for e in new.events if e.type in (
        "connection.send_unread", "connection.model_reacted")] == [
        ("connection.send_unread", 1), ("connection.send_unread", 2),
        ("connection.model_reacted", 2)], new.timeline()
    assert new.state.withholding == Withholding(holds_sends=2, unread_send=0)
    assert_server_clean(new)

    # Every handle, the old worker's and the new one's, is decided again on the same gate.
    report = replay(new.events)
    decisions = list(logged_decisions(new.events))
    n = len(decisions)
    assert report.ok, report.to_json()
    assert report.coverage == f"{n} of {n} decisions replayed"
    assert [d.kind for d in decisions].count("HandleArrived") == 3
    # The model's reaction is decided on the gate too, and decided again by replay.
    moved = [e for e in new.events if e.type in ("connection.earlier_turn_ended",
                                                  "connection.model_reacted")]
    assert [d.kind for d in decisions].count("ModelOutputObserved") == len(moved) >= 1
