"""One step (service/step.py): every commit, what it logged performed, then what is due, with
`due` asked once per round; a newer worker's epoch handled in one place; pipecat's state
written only by the service's `apply`.

The counting scenario runs a real pipeline against the local Gemini Live server: three tool
calls, each in a turn of its own. `due` is counted on the call's driver (a test double
around the real one), commits through an observer sink (service/observe.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from service import observe
from service.driver import Decision
from service.local_live import Audio, Call, Script, ToolCall, TurnComplete, WaitToolResponse
from service.step import Drain, Stepper
from session_store import Policy
from session_store import events as ev
from session_store.errors import Fenced

from .helpers import (Ctl, Flavour, assert_answered_once, assert_chain_ok, assert_log_settled,
                      assert_ran_once, assert_server_clean, migrated_sqlite, run_call)

pytestmark = pytest.mark.timeout(90)

ORDER = "lookup_order"
CALLS = ("c1", "c2", "c3")


class Counts:
    """Commits of one driver (an observer sink) and its `due` evaluations."""

    def __init__(self) -> None:
        self.driver: Any = None
        self.due = 0
        self.commits = 0

    def prepare(self, llm) -> None:
        self.driver = llm.driver
        real = llm.driver.due

        def counted():
            self.due += 1
            return real()

        llm.driver.due = counted

    def committed(self, driver, events) -> None:
        if driver is self.driver:
            self.commits += 1

    def left(self, driver, why) -> None:
        pass


@pytest.fixture
async def sqlite_flavour(tmp_path):
    async with migrated_sqlite(tmp_path / "step.db") as store:
        yield Flavour("sqlite", store)


async def test_due_is_asked_fewer_than_twice_per_commit(
        sqlite_flavour):
    steps: list = [Audio(chunks=2), TurnComplete()]
    for call_id in CALLS:
        steps += [ToolCall(Call(call_id, ORDER, {"id": call_id})), WaitToolResponse(call_id),
                  Audio(chunks=2), TurnComplete()]
    counts = Counts()

    async def drive(ctl: Ctl) -> None:
        assert await ctl.wait(lambda: ctl.script_done(0) and not ctl.tap.speaking,
                              timeout=20), "the calls were never all answered"
        await ctl.settle()

    observe.add(counts)
    try:
        run = await run_call(sqlite_flavour, [Script(steps, reply=())], drive,
                             policy=Policy(defer="none"), prepare=counts.prepare)
    finally:
        observe.remove(counts)

    assert_server_clean(run)
    for call_id in CALLS:
        assert_answered_once(run, call_id, ORDER, connection=0)
        assert_ran_once(run, call_id)
    assert_log_settled(run)
    await assert_chain_ok(run)
    print(f"\ndue() evaluations: {counts.due}; commits: {counts.commits}; "
          f"events: {len(run.events)}")
    # Before the one step every round asked `due` on the state as it was, then again in its
    # commit, and a drain asked again what the commit it followed had just asked: 30
    # evaluations for 14 commits here (2026-12-06, 0f0a24a); 23 with the step.
    assert counts.commits > len(CALLS) * 2, "the scenario did not run its tool calls"
    assert counts.due < 2 * counts.commits, (counts.due, counts.commits, run.timeline())


# --------------------------------------------------------------------------- the step itself

class FencedDriver:
    """A driver whose log belongs to a newer worker: every commit is refused."""

    def __init__(self) -> None:
        self.commits = 0

    async def observe(self, obs=None, *, intend=frozenset(), timeout=None) -> Decision:
        self.commits += 1
        raise Fenced("call", 1, 2)

    async def record(self, *events, intend=frozenset()) -> Decision:
        self.commits += 1
        raise Fenced("call", 1, 2)


class Effects:
    def __init__(self) -> None:
        self.due_lock = asyncio.Lock()
        self.performed: list[Decision] = []
        self.drains = 0

    async def perform(self, decision: Decision, kinds: frozenset[type]) -> bool:
        self.performed.append(decision)
        return True

    async def perform_due(self, kinds=frozenset(), *, after=None) -> None:
        self.drains += 1


@pytest.mark.parametrize("what", [None, [ev.AnomalyRecorded("x", {}, 0)]],
                         ids=["observation", "events"])
async def test_a_fenced_step_tells_the_service_once_and_performs_nothing(what):
    told: list[str] = []

    async def on_fenced() -> None:
        told.append("fenced")

    driver, effects = FencedDriver(), Effects()
    stepper = Stepper(driver, lambda coro, name: asyncio.ensure_future(coro),
                      on_fenced)
    stepper.effects = effects
    decision = await stepper.step(what, intend=frozenset({object}), drain=Drain.NOW,
                                  hold_effects=True)

    assert decision is None
    assert driver.commits == 1 and told == ["fenced"]
    assert effects.performed == [] and effects.drains == 0
    assert not effects.due_lock.locked()


class Driver:
    async def observe(self, obs=None, *, intend=frozenset(), timeout=None) -> Decision:
        return Decision(intents=[ev.AnomalyRecorded("x", {}, 0)] if intend else [])


@pytest.mark.parametrize("drain", list(Drain))
async def test_a_step_performs_what_it_logged_then_drains_as_asked(drain):
    effects = Effects()
    spawned: list[asyncio.Task] = []

    def spawn(coro, name):
        spawned.append(asyncio.ensure_future(coro))
        return spawned[-1]

    stepper = Stepper(Driver(), spawn, lambda: asyncio.sleep(0))
    stepper.effects = effects
    decision = await stepper.step(intend=frozenset({object}), drain=drain)
    await asyncio.gather(*spawned)

    assert decision is not None and decision.acted
    assert effects.performed == [decision]
    assert effects.drains == (0 if drain is Drain.NO else 1)
    assert len(spawned) == (1 if drain is Drain.LATER else 0)


async def test_only_the_service_writes_pipecats_state_and_only_what_changed(sqlite_flavour):
    from service.gemini_live import DurableGeminiLiveLLMService

    llm = DurableGeminiLiveLLMService(api_key="k", store=sqlite_flavour.store, call_id="c",
                                      system_instruction="Be brief.")
    state = llm.pipecat_state
    assert state.ready_for_realtime_input is llm._ready_for_realtime_input
    llm.apply(dataclasses.replace(state, ready_for_realtime_input=True,
                                  settings={**state.settings, "system_instruction": "NEW"}))
    assert llm._ready_for_realtime_input is True
    assert llm._settings.system_instruction == "NEW"
    assert llm._tools_from_init is state.tools_from_init
    assert llm.pipecat_state.with_current_prompt().system_instruction_from_init == "NEW"
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.bot_is_responding = True
