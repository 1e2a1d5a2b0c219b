"""Which resumption handles a session may be resumed from: issued, or withheld.

A handle the server issues right after the client sent content (a seed, a result as content,
a contextUpdate, a NON_BLOCKING call's response) may predate the server's reading of it: it
crosses the send on the wire, so the log would order it after the send although its state
lacks it. Such handles are logged as withheld (ev.HandleWithheld) until the model is seen to
react to what was sent: its first output of a turn begun after the send (a model at rest
reacts only to what it is sent; a turn under way at the send may end first, and a handle may
come in between). A blocking call's response needs none of this: Gemini issues no handle
while such a call is open.

Pure: the service reports what goes out and what comes in, `HandleGate` says which event
records each handle. One gate per worker; a new worker opens a new session, with a new gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import events as ev


@dataclass(frozen=True)
class Incoming:
    """What of a server message the gate needs."""

    generation: int
    handle: str | None = None  # a resumable handle it issues
    last_consumed_index: int | None = None
    reaction: bool = False  # model output, a toolCall or a turnComplete
    turn_ended: bool = False  # turnComplete or interrupted


@dataclass
class HandleGate:
    #: The generation whose handles hold all it was told (0: none).
    holds_sends: int = 0
    #: The generation with a send (a seed, content) not yet seen read (0: none).
    unread_send: int = 0
    #: A model turn was under way at that send: a reaction counts only from the next turn.
    turn_at_send: bool = False

    def sending(self, generation: int, model_generating: bool) -> None:
        """Something the server gives no sign of having read goes out on this session."""
        if self.holds_sends == generation:
            self.holds_sends = 0
        if self.unread_send != generation:
            self.turn_at_send = model_generating
        else:
            self.turn_at_send = self.turn_at_send or model_generating
        self.unread_send = generation

    def holds_everything(self, generation: int) -> None:
        """This session holds all it was told: resumed from a handle, or sent nothing."""
        self.holds_sends = generation

    def receive(self, message: Incoming) -> ev.Event | None:
        """The event that records the handle `message` issues (None if it issues none)."""
        if message.handle:
            if self.holds_sends == message.generation:
                return ev.HandleIssued(message.generation, message.handle,
                                       message.last_consumed_index)
            # Content went out that the server has not been seen to read: it may have issued
            # this handle before (seen: right after setupComplete). Never resumed.
            return ev.HandleWithheld(message.generation, message.handle)
        if self.unread_send == message.generation:
            if self.turn_at_send:
                if message.turn_ended:
                    self.turn_at_send = False  # that turn is over: the next one reacts
            elif message.reaction:
                self.holds_sends, self.unread_send = self.unread_send, 0
        return None
