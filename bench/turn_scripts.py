"""The scripted calls of bench/turn_overhead.py, in a module of their own: the local server
runs them in a process of its own (`python -m service.local_live --script ...`), which must
not import pipecat to load them."""

from __future__ import annotations



from service.local_live import (Audio, Call, Script, ToolCall, TurnComplete,
                                WaitFor, WaitToolResponse)

TOOL = "lookup_order"
AUDIO_BEFORE = 6   # chunks of 40 ms before each toolCall
AUDIO_AFTER = 4    # chunks after the answer


def opening() -> list:
    """The model speaks once the client's opening content is there, as Gemini does. (Without
    this, the first toolCall could reach pipecat's stock service before its context did:
    it logs "Function calls are not supported without a context object" and runs the call
    with no context; a CI run once hung on such a call.)"""
    return [WaitFor("client_content", timeout=10)]


def overhead_script(turns: int) -> Script:
    steps = opening()
    for i in range(turns):
        steps += [Audio(chunks=AUDIO_BEFORE), ToolCall(Call(f"t{i}", TOOL, {"id": i})),
                  WaitToolResponse(f"t{i}"), Audio(chunks=AUDIO_AFTER), TurnComplete()]
    return Script(steps, reply=())


def deferral_script(turns: int) -> Script:
    """Each call arrives mid-speech: 0.4 s of audio still to play after it."""
    steps = opening()
    for i in range(turns):
        steps += [Audio(chunks=4), ToolCall(Call(f"d{i}", TOOL, {"id": i})), Audio(chunks=10),
                  TurnComplete(), WaitToolResponse(f"d{i}", timeout=8), Audio(chunks=2),
                  TurnComplete()]
    return Script(steps, reply=())


def audio_chunks(script: Script) -> int:
    """How many audio chunks the server sends in the whole script."""
    return sum(step.chunks for step in script.steps if isinstance(step, Audio))
