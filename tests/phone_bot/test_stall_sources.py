"""The fleet's verdict on who made a stall (examples/phone_bot/fleet.py, stall_sources): the
rig's loop, the serving worker's, both, neither, or the ear (no dry-out), from the loop
samples of each process (examples/phone_bot/loop_lag.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from examples.phone_bot.fleet import CallOutcome, stall_sources
from examples.phone_bot.hearing import Hearing, Stall
from examples.phone_bot.loop_lag import blocked, worst

WORKER = "http://127.0.0.1:9001"
KILLED = "http://127.0.0.1:9002"
T = 1000.0  # the phone ran dry here; the late audio came 80 ms later


def sources(rig, workers, *, dry=True, worker=WORKER) -> list[str]:
    stall = Stall("greeting", 0.18, 0, T, T + 0.08, dry)
    call = SimpleNamespace(call_sid="CA1", streams=[SimpleNamespace(worker=worker)])
    outcome = CallOutcome("CA1", "+15550001000", [0], False, [],
                          hearing=Hearing(stalls=[stall]))
    return [row["source"] for row in stall_sources([call], [outcome], rig, workers)]


@pytest.mark.parametrize("rig, worker, source", [
    ([(T + 0.08, 0.08)], [], "rig"),  # the rig read the audio late: it may have been there
    ([], [(T - 0.5, 0.05), (T + 0.02, 0.04)], "worker"),  # the worker's writes fell behind
    ([(T + 0.08, 0.04)], [(T - 0.3, 0.04)], "both"),
    ([(T + 0.08, 0.01)], [(T - 0.3, 0.01)], "unexplained"),  # audio held, loops free
    ([], [(T - 2.0, 0.5)], "unexplained"),  # a block long before the stretch counts not
])
def test_a_stall_goes_to_the_loop_that_was_blocked_as_long_as_the_audio_was_late(
        rig, worker, source):
    assert sources(rig, {WORKER: worker}) == [source]


def test_the_killed_workers_stream_and_audio_without_a_tone_are_named_as_such():
    assert sources([], {WORKER: []}, worker=KILLED) == ["killed worker"]
    assert sources([(T + 0.08, 0.08)], {}, worker=KILLED) == ["rig"]
    assert sources([(T + 0.08, 0.08)], {WORKER: []}, dry=False) == ["quiet"]


def test_blocked_time_is_the_overlap_of_each_late_wake_up_with_the_window():
    samples = [(10.0, 0.5), (12.0, 0.1)]  # blocked over [9.5, 10] and [11.9, 12]
    assert blocked(samples, 9.8, 11.95) == pytest.approx(0.2 + 0.05)
    assert worst(samples, 9.8, 11.95) == 0.5
    assert worst(samples, 10.1, 11.8) == 0.0
