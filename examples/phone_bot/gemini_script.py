"""Gemini's side of the example's phone calls, played by the local Gemini Live server.

Every call goes the same way: the bot greets, the caller asks for a refund of their order,
the model asks for `refund_order` while it speaks, then for `send_receipt`, then says
goodbye. Like service.crash.scenarios.ServerPlan, each connection decides what to say
from what its session knows (a session resumed from a handle knows what the handle
captured, a fresh one what it was seeded with), so a call survives any number of worker
crashes. The caller is recognised by the number the bot puts in its system instruction.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field

from service.crash.scenarios import known_results
from service.local_live import (Audio, Call, Dynamic, InputTranscript, OutputTranscript,
                                Script, Sleep, ToolCall, TurnComplete, WaitFor,
                                WaitToolResponse)

GREETING = "Thanks for calling. How can I help?"
FAREWELL = "Done: your refund is on its way and the receipt is in your inbox. Goodbye!"
STILL_THERE = "Sorry, the line dropped for a moment. Is there anything else?"
SAYS = {"refund_order": "Let me refund order {order_id} for you.",
        "send_receipt": "And I am mailing you the receipt."}
_CALLER = re.compile(r"caller's number is (\+\d+)")
CHUNK_MS = 40.0
# How long a fresh session waits for its seed before it speaks (the service seeds every
# fresh session: the opening context of a new call, the logged conversation of a takeover).
# A real model says nothing before its first input, however late a worker under load sends
# it; 3.x refuses a seed that comes after the model spoke.
SEED_WAIT_S = 20.0


def order_of(caller: str) -> int:
    return int(caller[-4:])


def tool_calls(caller: str) -> tuple[tuple[str, dict], ...]:
    """The logical calls of one phone call, in order."""
    order = {"order_id": order_of(caller)}
    return (("refund_order", order), ("send_receipt", order))


@dataclass
class PhoneCallPlan:
    """The script of every connection, for all calls on one local server."""

    greeting_s: float = 1.2
    turn_s: float = 0.4
    farewell_s: float = 1.0
    caller_speaks_s: float = 1.0
    # Caller number -> when a closing turn was last sent (the caller hangs up after it).
    closing_sent: dict[str, float] = field(default_factory=dict)
    unknown_callers: list[int] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def script(self, conn) -> Script:
        if caller_of(conn) is None:
            self.unknown_callers.append(conn.index)
            return Script([], reply=())
        steps = [] if conn.resumed_from else [WaitFor("client_content", timeout=SEED_WAIT_S,
                                                      required=False)]
        return Script([*steps, Dynamic(self.plan)], reply=())

    def plan(self, conn) -> list:
        caller = caller_of(conn)
        state = conn.state
        answered = known_results(conn)
        pending = [(name, args) for name, args in tool_calls(caller) if name not in answered]
        steps: list = []
        if not said(conn, GREETING):
            steps += [_speech(self.greeting_s), OutputTranscript(GREETING), TurnComplete(),
                      Sleep(self.caller_speaks_s),
                      InputTranscript(f"Please refund order {order_of(caller)} and send me "
                                      f"the receipt.")]
        waiting = [cid for cid in state.outstanding()
                   if state.issued.get(cid) in {name for name, _ in pending}]
        if waiting:
            return [*steps, WaitToolResponse(waiting, timeout=30, required=False),
                    Dynamic(self.plan)]
        if pending:
            name, args = pending[0]
            call = Call(f"{name}-{next(self._ids)}", name, args)
            return [*steps, _speech(self.turn_s), OutputTranscript(SAYS[name].format(**args)),
                    ToolCall(call), _speech(self.turn_s), TurnComplete(),
                    WaitToolResponse([call.id], timeout=30, required=False), Dynamic(self.plan)]
        closing = STILL_THERE if said(conn, FAREWELL) else FAREWELL
        return [*steps, _speech(self.farewell_s), OutputTranscript(closing), TurnComplete(),
                Dynamic(lambda c: self._closed(caller))]

    def _closed(self, caller: str) -> list:
        self.closing_sent[caller] = time.time()
        return []


def caller_of(conn) -> str | None:
    match = _CALLER.search(conn.system_instruction or "")
    return match.group(1) if match else None


def said(conn, text: str) -> bool:
    """Has this session's model said `text`: in its own lineage, or in the history it was
    seeded with (the bot seeds a fresh session with the logged conversation)?"""
    if text in conn.state.spoken:
        return True
    for message in conn.messages("client_content"):
        for turn in (message.body or {}).get("turns") or []:
            if turn.get("role") == "model" and any(
                    text in (part.get("text") or "") for part in turn.get("parts") or []):
                return True
    return False


def _speech(seconds: float) -> Audio:
    return Audio(chunks=max(1, round(seconds * 1000 / CHUNK_MS)), chunk_ms=CHUNK_MS)
