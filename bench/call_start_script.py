"""Gemini's side of bench/call_start.py, in a module of its own: the local server runs it in
a process of its own (`python -m service.local_live --script ...`)."""

from __future__ import annotations



from service.local_live import Audio, Script, TurnComplete, WaitFor


def talk_on() -> Script:
    """Every connection: wait briefly for the seed, then speak for ten minutes, a 40 ms
    chunk every 36 ms (a little faster than real time, as Gemini is: the worker paces)."""
    return Script([WaitFor("client_content", timeout=3, required=False),
                   Audio(chunks=15000, chunk_ms=40, pause_ms=36), TurnComplete()], reply=())
