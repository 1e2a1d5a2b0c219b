"""Gemini's side of the example's phone calls, played by the local Gemini Live server.

Every call goes the same way: the bot greets, the caller asks for a refund of their order,
the model says it will refund the order and asks for `refund_order` (the caller still
hears the sentence when the call arrives), then likewise for `send_receipt`, then says
goodbye. Each connection decides what to say
from what its session knows (a session resumed from a handle knows what the handle
captured, a fresh one what it was seeded with), so a call survives any number of worker
crashes. The caller is recognised by the number the bot puts in its system instruction.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field

from service.local_live import (Audio, Call, Dynamic, InputTranscript, OutputTranscript,
                                Script, Sleep, ToolCall, TurnComplete, WaitFor,
                                WaitToolResponse)
from service.local_live.protocol import content_calls
from session_store.heard import CUT_MARK

GREETING = "Thanks for calling. How can I help?"
FAREWELL = "Done: your refund is on its way and the receipt is in your inbox. Goodbye!"
STILL_THERE = "Sorry, the line dropped for a moment. Is there anything else?"
SAYS = {"refund_order": "Let me refund order {order_id} for you.",
        "send_receipt": "And I am mailing you the receipt."}
#: Each utterance's tone (examples/phone_bot/hearing.py tells them apart in the caller's audio).
TONES = {"greeting": 440.0, "refund_order": 660.0, "send_receipt": 880.0, "farewell": 1100.0,
         "still_there": 1320.0}
_CALLER = re.compile(r"caller's number is (\+\d+)")
CHUNK_MS = 40.0
# How long a resumed session waits for what it lacks before it speaks (2.5 is told turns
# and calls after its handle as content, just after it connects); a real model waits for
# input too.
CATCH_UP_WAIT_S = 1.5
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
    turn_s: float = 0.8  # a tool step's sentence, said before its call
    farewell_s: float = 1.0
    caller_speaks_s: float = 1.0
    # Caller number -> when a closing turn was last sent (the caller hangs up after it).
    closing_sent: dict[str, float] = field(default_factory=dict)
    unknown_callers: list[int] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def lengths(self) -> dict[str, float]:
        """How long each utterance lasts (its tone's audio), for the caller's ear."""
        turn = _chunks(self.turn_s) * CHUNK_MS / 1000
        farewell = _chunks(self.farewell_s) * CHUNK_MS / 1000
        return {"greeting": _chunks(self.greeting_s) * CHUNK_MS / 1000,
                "refund_order": turn, "send_receipt": turn, "farewell": farewell,
                "still_there": farewell}

    def script(self, conn) -> Script:
        if caller_of(conn) is None:
            self.unknown_callers.append(conn.index)
            return Script([], reply=())
        # A fresh session waits for its seed, a resumed one for what it lacks (if anything).
        wait = CATCH_UP_WAIT_S if conn.resumed_from else SEED_WAIT_S
        return Script([WaitFor("client_content", timeout=wait, required=False),
                       Dynamic(self.plan)], reply=())

    def plan(self, conn) -> list:
        """The next step from the newest exchange this session holds (heard, said, seeded
        or told), as a model goes on from its context: never a step it holds again."""
        caller = caller_of(conn)
        state = conn.state
        answered = state.answered_names()
        steps: list = []
        if left := unsaid(conn, GREETING):
            steps += [*_say(self.greeting_s, "greeting", GREETING, left),
                      TurnComplete(), Sleep(self.caller_speaks_s),
                      InputTranscript(f"Please refund order {order_of(caller)} and send me "
                                      f"the receipt.")]
        for name, args in tool_calls(caller):
            if name in answered:
                continue
            waiting = [cid for cid in state.outstanding() if state.issued.get(cid) == name]
            if waiting:
                return [*steps, WaitToolResponse(waiting, timeout=30, required=False),
                        Dynamic(self.plan)]
            if name in told_calls(conn):  # asked for before this session: its result comes
                return [*steps, WaitFor("function_result", timeout=30, required=False),
                        Dynamic(self.plan)]
            call = Call(f"{name}-{next(self._ids)}", name, args)
            line = SAYS[name].format(**args)
            wait = [TurnComplete(), WaitToolResponse([call.id], timeout=30, required=False),
                    Dynamic(self.plan)]
            if not (left := unsaid(conn, line)):  # announced, not yet asked: just ask
                return [*steps, ToolCall(call), *wait]
            # All of the sentence, its audio and its words, before the call: a model with
            # a blocking call says what it will do, asks, and waits (audio after the call
            # with no words of its own was logged as a message half as long as it played).
            return [*steps, *_say(self.turn_s, name, line, left), ToolCall(call), *wait]
        if left := unsaid(conn, FAREWELL):
            closing = _say(self.farewell_s, "farewell", FAREWELL, left)
        else:
            closing = _say(self.farewell_s, "still_there", STILL_THERE, 1.0)
        return [*steps, *closing, TurnComplete(), Dynamic(lambda c: self._closed(caller))]

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


def unsaid(conn, text: str) -> float:
    """The share of `text` this session's model has yet to say: 0 if it said it, 1 if it
    said none of it, else the rest after the part the caller heard of a turn it was seeded
    cut (`heard —`: a worker died while it played, or the caller talked over it). A model
    goes on from there; it does not start the sentence again."""
    if said(conn, text):
        return 0.0
    words, heard = text.split(), 0
    for turn in _seeded_model_turns(conn):
        if turn.endswith(CUT_MARK.strip()):
            part = turn[:-len(CUT_MARK.strip())].split()
            if part and words[:len(part)] == part:
                heard = max(heard, len(part))
    if heard and " ".join(words[heard:]) in conn.state.spoken:
        return 0.0  # (it said the rest already)
    return 1.0 - heard / len(words)


def _seeded_model_turns(conn) -> list[str]:
    return [(part.get("text") or "").strip()
            for message in conn.messages("client_content")
            for turn in (message.body or {}).get("turns") or [] if turn.get("role") == "model"
            for part in turn.get("parts") or []]


def told_calls(conn) -> set[str]:
    """Functions this session was told were asked for before it (a seed or a catch-up)."""
    return {name for message in conn.messages("client_content")
            for name in content_calls((message.body or {}).get("turns") or [])}


def _chunks(seconds: float) -> int:
    return max(1, round(seconds * 1000 / CHUNK_MS))


def _say(seconds: float, utterance: str, text: str, left: float) -> list:
    """`utterance` said (its audio, then its transcript), or the `left` share of its end."""
    words = text.split()
    rest = " ".join(words[len(words) - round(left * len(words)):]) if left < 1.0 else text
    return [_speech(seconds * left, utterance), OutputTranscript(rest)]


def _speech(seconds: float, utterance: str) -> Audio:
    """`utterance`'s audio: its own tone."""
    return Audio(chunks=_chunks(seconds), chunk_ms=CHUNK_MS, tone_hz=TONES[utterance])
