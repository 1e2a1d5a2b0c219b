"""The handles' gate as the service sees it: what goes out that the model has not read, the
model output that shows it read it, and the handles that arrive. It decides nothing and keeps
nothing: the model output and the handles are observations (ModelOutputObserved,
HandleArrived) decided on the gate the log folds (session_store.withholding), so a worker
that takes over and `replay` see the same gate and replay decides both again.

`SendUnread` is a fact, logged as a plain event: a send about to go out (as
`conversation.sending` records one). It decides nothing by itself; what it leads to (a handle
withheld or issued) is decided on it and replayed. (`HoldsAll`, a session known to hold all
it was told, is the seed's decision: session_store.seeding.)

The gate's events ride commits that happen anyway (a send's confirmation, the handle that
arrives, the model's speech starting: `LogWriter.along`), so a turn commits as often as
before."""

from __future__ import annotations

from dataclasses import dataclass

from session_store import events as ev
from session_store.decide import HandleArrived
from session_store.withholding import ModelOutputObserved, model_output

from .driver import CallDriver
from .log_writer import LogWriter, When


@dataclass(frozen=True)
class Incoming:
    """What of a server message the gate needs."""

    generation: int
    handle: str | None = None  # a resumable handle it issues
    last_consumed_index: int | None = None
    reaction: bool = False  # model output, a toolCall or a turnComplete
    turn_ended: bool = False  # turnComplete or interrupted


class HandleGate:
    """Reports the gate's inputs to the log, for one service."""

    def __init__(self, driver: CallDriver, log: LogWriter):
        self._driver = driver
        self._log = log

    def sending(self, generation: int, model_generating: bool) -> None:
        """Something the server gives no sign of having read goes out on this session: noted
        before the send, so a handle read after it is decided after it."""
        self._log.along(ev.SendUnread(generation, model_generating))

    async def receive(self, message: Incoming) -> None:
        """A server message: the handle it issues, decided on the log; or its model output,
        decided on the log too, handed over only if it moves the gate on the gate the log
        will hold (most messages move nothing, and must cost no commit: the same rule,
        withholding.model_output, that decide applies)."""
        if message.handle:
            # Logged in order, without holding up the receive loop (and the audio behind it).
            await self._log.log(HandleArrived(message.generation, message.handle,
                                              message.last_consumed_index), when=When.LAZY)
            return
        if not (message.reaction or message.turn_ended):
            return
        output = ModelOutputObserved(message.generation, message.reaction,
                                     message.turn_ended)
        if model_output(self._driver.gate(), output.generation, reaction=output.reaction,
                        turn_ended=output.turn_ended) is not None:
            self._log.along(output)
