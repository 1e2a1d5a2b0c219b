"""A handle the server refused stays refused for the worker that takes the call over.

The service kept the handles it passed over in memory: a new worker on the same log chose
the newest handle again, the one the server had refused, and paid one more refused handshake
(and its backoff) before it fell back. The refusal is now a fact in the log
(`connection.handle_refused`), folded into the state, and the choice of handle skips it.
Real pipelines, real google-genai client, two local servers sharing the handles they issued
(as Gemini's handles outlive a worker), two services on one database.
"""

from __future__ import annotations

import pytest

from service.local_live import (Audio, Call, Close, OutputTranscript, Script, ToolCall,
                                TurnComplete, WaitToolResponse)

from session_store.audit import build_timeline, replay

from .helpers import CallRun, Ctl, generation_of, handles_of, run_call

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_new_worker_does_not_ask_again_for_a_handle_the_old_one_saw_refused(flavour):
    # The old worker: its session gains a turn and an answered call after its first handle,
    # the server closes it (1011), refuses the resumption from the newest handle, and the
    # session after it issues no handle (so the refused one stays the newest in the log).
    old_scripts = [
        Script([OutputTranscript("one"), Audio(chunks=2), TurnComplete(),
                ToolCall(Call("c1", ORDER, {"id": 1})), WaitToolResponse("c1"),
                OutputTranscript("two"), Audio(chunks=2), TurnComplete(),
                Close(1011, "internal error")], reply=()),
        Script.refusing_handle(),
        Script([Audio(chunks=2), TurnComplete()], reply=(), resumption_after_turn=False),
    ]
    taken_over: list[CallRun] = []

    async def old_worker(ctl: Ctl):
        await ctl.wait(lambda: ctl.script_done(2) and not ctl.tap.speaking, timeout=12)
        await ctl.settle()
        refused = handles_of(ctl.server, 0)[-1]
        assert ctl.server.connections[1].resumption_handle == refused

        def as_the_api(connection):  # a refused handle is refused to any client
            if connection.resumption_handle == refused:
                return Script.refusing_handle()
            return Script([Audio(chunks=2), TurnComplete()], reply=())

        async def new_worker(ctl2: Ctl):
            await ctl2.wait(lambda: ctl2.llm._session is not None and ctl2.script_done(0)
                            and not ctl2.tap.speaking, timeout=12)
            await ctl2.settle()

        # The new worker attaches to the live call (the old one is fenced from then on).
        taken_over.append(await run_call(flavour, as_the_api, new_worker,
                                         call_id=ctl.llm.call_id,
                                         server_handles=dict(ctl.server.handles)))

    old = await run_call(flavour, old_scripts, old_worker)
    new, = taken_over

    first, refused = handles_of(old.server, 0)[0], handles_of(old.server, 0)[-1]
    older = first if generation_of(old) == "2.5" else None  # (test_handshake_failures.py)
    asked = [c.resumption_handle for c in new.connections]
    assert asked == [older], (
        f"the old worker saw the server refuse {refused!r}; the new worker must not ask for "
        f"it again but resume from {older!r}; handles asked for: {asked}")

    marks = new.find("connection.handle_refused")
    assert [(e.data["handle"], e.data["reason"]) for e in marks] == [(refused, "refused")]
    assert len(new.find("anomaly.recorded", kind="handshake_failed")) == 1  # the old one's
    assert new.state.handles[refused].refused and new.state.closed
    report = replay(new.events)  # today's code makes the same choices of handle
    assert report.ok, [d.message for d in report.divergences]
    line, = [e for e in build_timeline(new.events).entries
             if e.type == "connection.handle_refused"]
    assert "refused to resume from it" in line.summary, line
