"""Giving up on an unreachable Gemini is decided on the log (decide.gives_up), through the
real pipeline, the real google-genai client and the local server: the failures in a row
are counted on the log's clock, the `connection_given_up` outcome is logged with the
observation it was decided on (replay decides it again), the service tells pipecat and its
app, and no session is tried after it. A session lost before any server message counts;
its Disconnected is logged with the give-up (the receive loop's give-up logged none)."""

from __future__ import annotations

import pytest

from service.local_live import Audio, Close, Script, TurnComplete
from session_store import Policy
from session_store.audit import replay
from session_store.audit.replay import logged_decisions

from .helpers import Ctl, run_call

pytestmark = pytest.mark.timeout(90)

WINDOW_S = 1.5
#: Longer than a takeover and the new worker's give-up take on a loaded machine (a few s).
HELD_HANDSHAKE_S = 12.0
UNAVAILABLE = "The service is currently unavailable."


def _told(errors: list[str]):
    def prepare(llm):
        @llm.event_handler("on_connection_given_up")
        async def given_up(_service, error):
            errors.append(str(error))
    return prepare


async def _lost_then_refused_until_given_up(flavour, errors: list[str], **options):
    """A session that got messages, then lost (the run of failures starts there), and every
    handshake after it refused, until the service gives the connection up."""
    def scripts(conn):
        if conn.index == 0:
            return Script([Audio(chunks=2), TurnComplete(), Close(1011, "internal error")],
                          reply=())
        return Script(refuse_setup=1011, refuse_reason=UNAVAILABLE)

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: errors, timeout=20), "never given up"
        await ctl.settle(1.0)

    return await run_call(flavour, scripts, drive, reconnect_window_s=WINDOW_S,
                          prepare=_told(errors), timeout=40, **options)


def _assert_decided_and_replayed(run, on: str) -> None:
    """The give-up was decided on an `on` observation, in its append, once the window had
    passed since the first failure of the run (the first session lost to an error here)."""
    [anomaly] = run.find("anomaly.recorded", kind="connection_given_up")
    [observed] = [r for r in run.events if r.type == "decision.observed"
                  and r.recorded_at_us == anomaly.recorded_at_us]
    assert observed.data["kind"] == on and observed.version < anomaly.version, run.timeline()
    detail = anomaly.data["detail"]
    assert detail["window_s"] == WINDOW_S and detail["failures"] >= 3, detail
    first = run.find("connection.disconnected", reason="error")[0]
    assert anomaly.recorded_at_us - first.recorded_at_us >= WINDOW_S * 1e6, run.timeline()
    assert run.state.given_up
    report = replay(run.events)
    n = len(list(logged_decisions(run.events)))
    assert report.ok, [d.message for d in report.divergences]
    assert report.coverage == f"{n} of {n} decisions replayed", report.coverage


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_handshakes_failing_for_the_window_give_the_connection_up_on_the_log(flavour):
    errors: list[str] = []

    run = await _lost_then_refused_until_given_up(flavour, errors)

    assert len(errors) == 1, errors
    _assert_decided_and_replayed(run, "HandshakeFailed")
    [anomaly] = run.find("anomaly.recorded", kind="connection_given_up")
    failed = run.find("anomaly.recorded", kind="handshake_failed")
    assert failed and failed[-1].version < anomaly.version
    # Nothing was tried after it: every connection but the first was a failed handshake.
    assert len(run.server.connections) == 1 + len(failed), len(run.server.connections)


@pytest.mark.generations("2.5", "3.8", "3.8-thinking", reason="3.1 answers the seed with a "
                         "usageMetadata message: a session that got one ends the run")
@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_sessions_lost_before_any_message_are_given_up_with_their_disconnect(flavour):
    errors: list[str] = []

    async def drive(ctl: Ctl):
        assert await ctl.wait(lambda: errors, timeout=25), "never given up"
        await ctl.settle(1.0)

    # Every setup goes through, every session is closed before it says anything.
    run = await run_call(flavour, Script([Close(1011, "internal error")], reply=()), drive,
                         reconnect_window_s=WINDOW_S, prepare=_told(errors), timeout=40)

    assert len(errors) == 1, errors
    _assert_decided_and_replayed(run, "SessionLeft")
    [anomaly] = run.find("anomaly.recorded", kind="connection_given_up")
    left = [r for r in run.events if r.type == "connection.disconnected"]
    assert left and all(r.data["reason"] == "error" and r.data["heard"] is False
                        for r in left), run.timeline()
    # The session the give-up came from is logged as left, in the same decision.
    assert left[-1].recorded_at_us == anomaly.recorded_at_us, run.timeline()
    assert not run.state.connected
    connected = [r for r in run.events if r.type == "connection.connected"]
    assert len(connected) == len(left) == len(run.server.connections)


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_worker_that_takes_over_during_the_failures_keeps_their_window(flavour):
    """The old worker's failures are in the log: the new one goes on with that run (its
    count and its start), where the shell's clock in memory started a window of its own."""
    taken_over: list = []
    errors: list[str] = []

    def scripts(conn):
        if conn.index == 0:
            return Script([Audio(chunks=2), TurnComplete(), Close(1011, "internal error")],
                          reply=())
        if conn.index == 1:
            return Script(refuse_setup=1011, refuse_reason=UNAVAILABLE)
        # Then a handshake held long past the takeover: the old worker cannot fail a third
        # time and give up itself before the new one has taken over (on a loaded machine
        # starting the new worker took longer than the window). Not for ever: the old
        # worker's pipeline ends only once it returns (60 s held each run ~61 s).
        return Script(setup_delay=HELD_HANDSHAKE_S)

    async def old_worker(ctl: Ctl):
        assert await ctl.wait(lambda: ctl.llm.driver.state.failures_in_row >= 2, timeout=10)

        async def new_worker(ctl2: Ctl):
            assert await ctl2.wait(lambda: errors, timeout=20), "never given up"
            await ctl2.settle(0.5)

        taken_over.append(await run_call(
            flavour, Script(refuse_setup=1011, refuse_reason=UNAVAILABLE), new_worker,
            call_id=ctl.llm.call_id, server_handles=dict(ctl.server.handles),
            reconnect_window_s=WINDOW_S, prepare=_told(errors), timeout=40))

    await run_call(flavour, scripts, old_worker, reconnect_window_s=WINDOW_S, timeout=60)
    new, = taken_over

    assert len(errors) == 1, errors
    [attached] = new.find("session.worker_attached")
    [anomaly] = new.find("anomaly.recorded", kind="connection_given_up")
    first = new.find("connection.disconnected", reason="error")[0]  # the old worker's
    before = [r for r in new.find("anomaly.recorded", kind="handshake_failed")
              if r.version < attached.version]
    after = [r for r in new.find("anomaly.recorded", kind="handshake_failed")
             if r.version > attached.version]
    assert before and after, new.timeline()
    detail = anomaly.data["detail"]
    # The run the new worker gave up is the one the old worker began: its first failure,
    # every failure since, whichever worker saw it.
    assert detail["failures"] == 1 + len(before) + len(after), (detail, new.timeline())
    assert detail["failing_for_s"] == pytest.approx(
        (anomaly.recorded_at_us - first.recorded_at_us) / 1e6, abs=1e-3)
    assert detail["failing_for_s"] >= WINDOW_S
    report = replay(new.events)
    n = len(list(logged_decisions(new.events)))
    assert report.ok, [d.message for d in report.divergences]
    assert report.coverage == f"{n} of {n} decisions replayed", report.coverage


@pytest.mark.parametrize("flavour_name", ["sqlite", "postgres"], indirect=True)
async def test_a_policy_that_ends_the_call_on_give_up_logs_its_end_with_the_give_up(flavour):
    """Policy.end_call_on_give_up: the service ends the call in the commit that gives the
    connection up (the app is still told, and only has its own side to close); replay,
    given the policy, decides the end again."""
    errors: list[str] = []
    policy = Policy(end_call_on_give_up="gemini_unreachable")

    run = await _lost_then_refused_until_given_up(flavour, errors, policy=policy)

    assert len(errors) == 1, errors
    [anomaly] = run.find("anomaly.recorded", kind="connection_given_up")
    [closed] = run.find("session.closed")
    assert closed.data["reason"] == "gemini_unreachable"
    # The same decision, the same commit: nothing between them.
    assert (closed.version, closed.recorded_at_us) == (anomaly.version + 1,
                                                       anomaly.recorded_at_us), run.timeline()
    assert run.state.closed and run.state.given_up
    report = replay(run.events, policy)
    n = len(list(logged_decisions(run.events)))
    assert report.ok, [d.message for d in report.divergences]
    assert report.coverage == f"{n} of {n} decisions replayed", report.coverage
