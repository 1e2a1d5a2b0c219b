"""DurableGeminiLiveLLMService: pipecat's Gemini Live service, driven by the call's event log.

The subclass is a thin shell. It reports what it observes (tool calls, speech, settings,
handles, goAway, cancellations, results) to the CallDriver, which appends the facts and the
decisions to the log before anything acts on them; then it performs whatever `due()` says is
due now: start calls, resolve in-doubt calls, send results by the delivery rules, reconnect.
Startup after a crash is the same path: attach (new fencing epoch), connect with the handle
the log allows, and perform what is due.

The class is split by concern: this module observes (server messages, speech, settings);
connections.py opens, replaces and retries sessions; effects.py decides and acts (observe →
commit → act, result delivery); seeding.py tells a fresh session the call so far. Every private pipecat hook these override or read is pinned by
tests/service/test_pipecat_contract.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import re
import time
import uuid
from typing import Any, Literal

import pydantic
from loguru import logger
from pipecat.frames.frames import (BotStartedSpeakingFrame, BotStoppedSpeakingFrame, EndFrame,
                                   InterruptionFrame)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from session_store import Policy
from session_store import events as ev
from session_store.checks import check_count, check_seconds
from session_store.decide import (CancellationArrived, FunctionCall, GoAway,
                                  InterruptionObserved, ResolveInDoubt, ServerMessageRejected,
                                  SettingsUpdate, SpeechStarted, SpeechStopped, ToolCallsArrived,
                                  cancelled_with, decide, waits_for_silence)
from session_store.errors import Fenced
from session_store.storage import SqlEventStore

from .connections import RECONNECT_WINDOW_S, SessionConnections
from .driver import CallDriver
from .effects import DueEffects, jsonable
from .redaction import redact_settings
from .seeding import SessionSeeding
from .wire import Rejection, with_frame_limit

# Settings restored from the log on takeover (plain strings; secrets were never logged).
RESTORED_SETTINGS = ("system_instruction", "voice", "language")
#: The largest websocket frame the service reads (google-genai's default is 1 MiB). Larger
#: than Policy.max_args_bytes on purpose: a tool call with oversized arguments then arrives
#: and is answered with an explicit error, instead of the client closing the socket (1009)
#: on a call the model would ask for again on the resumed session, until pipecat gives up.
MAX_FRAME_BYTES = 16 << 20
# At cleanup, how long lazy notes left over may take to be logged.
CLEANUP_NOTES_WAIT_S = 2.0
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*s?\s*$")


def parse_time_left(value: Any) -> float:
    """goAway.timeLeft arrives as a protobuf Duration string such as "3s" (or "1.5s")."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "total_seconds"):
        return float(value.total_seconds())
    match = _DURATION.match(str(value))
    return float(match.group(1)) if match else 0.0


class DurableGeminiLiveLLMService(SessionConnections, DueEffects, SessionSeeding,
                                  GeminiLiveLLMService):
    """Drop-in GeminiLiveLLMService whose behaviour is decided from a durable event log.

    Extra arguments: `store` (from `session_store.open_store`), `call_id` (the stream; an
    existing open call is taken over), `policy` (deferral, idempotent tools, reuse of
    re-issued calls), `worker_id`, `speaking_signal` ("transport": the bot speaks from the
    first model audio until the output transport's BotStoppedSpeakingFrame; "model": until
    turnComplete, for pipelines without an output transport; the transport's frames, if any,
    then only hold the watchdog off) and `speaking_timeout_s` (a
    safety net: with no model output and no transport signal for that long the bot counts as
    silent, so a server that holds turnComplete until it gets a tool response cannot
    deadlock the call). `snapshot_every`: events between snapshots of the call's decision
    state (a takeover of a long call loads the newest one and the events after it).
    `max_frame_bytes`: the largest server frame read (MAX_FRAME_BYTES).
    `reconnect_window_s`: connection failures in a row are retried for that long (with
    backoff) before the service is given up (RECONNECT_WINDOW_S; pipecat gives up at three).
    """

    def __init__(self, *args, store: SqlEventStore, call_id: str, policy: Policy | None = None,
                 worker_id: str | None = None,
                 speaking_signal: Literal["transport", "model"] = "transport",
                 speaking_timeout_s: float = 4.0, snapshot_every: int = 500,
                 max_frame_bytes: int = MAX_FRAME_BYTES,
                 reconnect_window_s: float = RECONNECT_WINDOW_S, **kwargs):
        if speaking_signal not in ("transport", "model"):
            raise ValueError(f"speaking_signal must be 'transport' or 'model', not "
                             f"{speaking_signal!r}")
        check_seconds("speaking_timeout_s", speaking_timeout_s)
        check_seconds("reconnect_window_s", reconnect_window_s, zero_ok=True)
        check_count("max_frame_bytes", max_frame_bytes)
        kwargs["http_options"] = with_frame_limit(kwargs.get("http_options"), max_frame_bytes)
        super().__init__(*args, **kwargs)
        self._max_frame_bytes = max_frame_bytes
        self._driver = CallDriver(store, call_id, policy, worker_id, snapshot_every)
        self._speaking_signal = speaking_signal
        self._speaking_timeout_s = speaking_timeout_s
        self._last_speech_activity = 0.0
        self._connecting_handle: str | None = None
        self._bad_handles: set[str] = set()  # refused, or failing every time: passed over
        self._handle_failures: dict[str, int] = {}  # handshake failures in a row, per handle
        self._reconnect_window_s = reconnect_window_s
        self._failing_since: float | None = None  # the first of the failures in a row
        self._failures_in_row = 0  # (the backoff's; pipecat's own count is kept short)
        self._due_lock = asyncio.Lock()
        self._seeded_generation = 0
        self._reconnect_task: asyncio.Task | None = None
        self._reconnecting = False  # a _reconnect_now is under way (whichever task runs it)
        self._resyncs: list[float] = []  # when recent resyncs (RESYNC_KINDS) reconnected
        self._unknown_logged: set[str] = set()  # unknown message fields already logged
        self._notes_task: asyncio.Task | None = None
        self._notes_due = asyncio.Event()  # a note that must not wait is queued
        self._notes_waiting = False  # the notes task waits for an append to take lazy notes
        self._effects_failed = False  # an effect's append failed: the notes task retries
        self._call_ending = False  # stop() or cleanup() began: outages are not waited out
        self._driver.on_commit = self._after_commit
        self._watchdog_task: asyncio.Task | None = None
        # The output transport's own view: between its BotStarted and BotStoppedSpeakingFrame.
        self._transport_speaking = False
        # Model turns with output begun, and how many of them the transport finished playing:
        # a transport stop ends the bot's speech only once it has played every turn begun.
        self._model_turns = 0
        self._turns_played = 0
        self._transcript: dict[str, list[str]] = {"user": [], "assistant": []}
        # Ids Gemini cancelled, as they come off the wire: a start committed meanwhile (the
        # cancellation waiting behind it to be logged) must not run (`_run_started`).
        self._cancelled_on_wire: set[str] = set()
        # Handles are resumable only once the server was seen to read what went out as
        # content (ev.HandleWithheld): the generation whose handles hold all it was told,
        # the one with a seed or content not yet seen read, and whether a model turn was
        # under way at that send (a reaction then counts only from the next turn).
        self._handles_hold_sends = 0
        self._unread_send = 0
        self._turn_at_send = False

    # ------------------------------------------------------------------ public helpers
    @property
    def call_id(self) -> str:
        return self._driver.call_id

    @property
    def driver(self) -> CallDriver:
        return self._driver

    def idempotency_key(self, tool_call_id: str) -> str | None:
        """The key a tool handler should use to make a re-run after a crash harmless."""
        call = self._driver.state.calls.get(tool_call_id)
        return call.idempotency_key if call else None

    # ------------------------------------------------------------------ lifecycle
    async def setup(self, setup: FrameProcessorSetup):
        state = await self._driver.attach(model=str(self._settings.model),
                                          tools=self._tool_names(),
                                          settings=self._settings_snapshot())
        logger.info(f"{self}: call {self.call_id} attached at version {state.version}, "
                    f"epoch {self._driver.epoch}")
        # A takeover continues with the settings the log says are current, not the ones this
        # worker was constructed with (the app may have changed the prompt before the crash).
        composed = self._settings.system_instruction  # as constructed (with pipecat's addons)
        for key in RESTORED_SETTINGS:
            if isinstance(state.settings.get(key), str):
                setattr(self._settings, key, state.settings[key])
        prompt = state.settings.get("system_instruction")
        if isinstance(prompt, str):
            self._system_instruction_from_init = prompt
            if prompt != composed:
                # pipecat rebuilds `_settings.system_instruction` from the base prompt it took
                # at construction (`_compose_system_instruction`, on the first context's tool
                # sync): without this the constructed prompt came back there, and the first
                # reconnect after a takeover sent it (tests/service/test_takeover_seed.py).
                self._base_system_instruction = base_prompt(
                    prompt, composed, self._base_system_instruction)
        # Calls a dead worker left in doubt are settled before the new session is seeded, so
        # the model learns their outcome with its history instead of asking again. (Re-runs
        # of idempotent ones wait for the pipeline: no tool runs before it has started.)
        await self._perform_due(lambda e: isinstance(e, ResolveInDoubt))
        # The first connection resumes from the newest handle the log allows (takeover).
        self._session_resumption_handle = self._driver.resumption_handle()
        await super().setup(setup)
        self._watchdog_task = self.create_task(self._speech_watchdog(), "speech_watchdog")

    async def stop(self, frame: EndFrame):
        self._call_ending = True
        await self._close_call("ended")
        await super().stop(frame)

    async def cleanup(self):
        self._call_ending = True
        if self._watchdog_task:
            await self.cancel_task(self._watchdog_task)
            self._watchdog_task = None
        if self._notes_task and self._notes_waiting:
            # Lazy notes that came after stop() (the transport's last stop, a confirmation):
            # no commit will take them along now, so log them (an outage is not waited out).
            self._notes_due.set()
            await asyncio.wait({self._notes_task}, timeout=CLEANUP_NOTES_WAIT_S)
        if self._notes_task and not self._notes_task.done() and self._driver.has_notes:
            # What is left is the notes task waiting out an outage past the end of the call.
            # Say so, do not leave it running.
            logger.error(f"{self}: call {self.call_id} ended with "
                         f"{self._driver.pending_notes} noted fact(s) the log never took")
            await self.cancel_task(self._notes_task)
        await super().cleanup()

    async def _close_call(self, reason: str) -> None:
        if self._driver.fenced or self._driver.state.closed:
            return
        try:
            events: list[ev.Event] = []
            if self._driver.state.connected:
                events.append(ev.Disconnected(self._driver.state.generation, "shutdown"))
            events.append(ev.SessionClosed(reason))
            await self._driver.record(*events)
        except Exception as exc:  # noqa: BLE001 - shutting down: report, do not hang
            logger.error(f"{self}: could not record the end of call {self.call_id}: {exc}")

    def _tool_names(self) -> list[str]:
        tools = self._tools_from_init
        standard = getattr(tools, "standard_tools", None) or []
        return sorted(getattr(t, "name", str(t)) for t in standard)

    def _settings_snapshot(self) -> dict[str, Any]:
        values = {}
        for key in ("model", "system_instruction", "voice", "language", "modalities"):
            value = getattr(self._settings, key, None)
            if value is not None and type(value).__name__ != "NotGiven":
                values[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        return redact_settings(values)

    # ------------------------------------------------------------------ server messages
    async def _handle_server_message(self, message):
        # A session that delivered a message is progress. pipecat resets its failure count
        # only after 10 s on one connection, so three sessions each closed right after a
        # toolCall (seen in the hostile-wire fuzz) gave the service up, results undelivered.
        # Handshakes failing in a row still count: an unreachable server is given up.
        self._consecutive_failures = 0
        try:
            await self._observe_server_message(message)
        except Fenced:
            await self._on_fenced()
            return
        except Exception as exc:  # noqa: BLE001 - our bookkeeping must not count as a socket error
            logger.exception(f"{self}: failed to record a server message: {exc}")
        try:
            await super()._handle_server_message(message)
        except Exception as exc:  # noqa: BLE001 - a message pipecat chokes on is not a socket error
            # It would count as one (reconnect, and the service given up after three): log it
            # and let the log resync the session like any message we could not take in.
            logger.exception(f"{self}: pipecat failed on a server message: {exc}")
            fields = sorted(k for k, v in message if v is not None)
            self._note(ServerMessageRejected("message_handling_failed", {
                "fields": fields, "error": f"{type(exc).__name__}: {str(exc)[:200]}"},
                self._driver.state.generation))
        sc = message.server_content
        if sc and sc.turn_complete:
            await self._flush_transcript()
            if self._speaking_signal == "model":  # noted: the receive loop must not wait
                self._note_stop("turn_complete")

    async def _observe_server_message(self, message) -> None:
        gen = self._driver.state.generation
        update = message.session_resumption_update
        if update and update.resumable and update.new_handle:
            # Logged in order, without holding up the receive loop (and the audio behind it).
            if self._handles_hold_sends == gen:
                self._note(ev.HandleIssued(gen, update.new_handle,
                                           update.last_consumed_client_message_index),
                           lazy=True)
            else:
                # Content went out (a seed, a result) that the server has not been seen to
                # read: it may have issued this handle before (seen: right after
                # setupComplete), so its state may lack it. Never resumed.
                self._note(ev.HandleWithheld(gen, update.new_handle), lazy=True)
        elif self._unread_send == gen:
            self._saw_reaction(message)
        if message.go_away is not None:
            time_left = parse_time_left(message.go_away.time_left)
            read_at = time.monotonic()

            def go_away(state, gen=gen):
                # Gemini's deadline counts from now; the log's from the goAway's record time,
                # later when the goAway waited for a commit in flight. Logged with the time
                # left then: counted from its record time, the deadline was late, the timer
                # below found it "not near" yet, and nothing looked again before Gemini closed
                # the session mid-turn (tests/service/test_go_away_timing.py).
                left = max(time_left - (time.monotonic() - read_at), 0.0)
                return decide(state, GoAway(gen, left), self._driver.policy)

            # In the receive loop, bounded while the database is down (`_log_now`).
            await self._log_now(go_away)
            margin = self._driver.policy.go_away_margin_s
            self.create_task(self._due_after(max(time_left - margin, 0.0)), "go_away_deadline")
        if message.tool_call_cancellation is not None:
            ids = tuple(message.tool_call_cancellation.ids or ())
            self._cancelled_on_wire.update(i for i in ids if isinstance(i, str))
            # What runs for them: each call, or the original a re-issued id waits for.
            running = [c.call_id for c in cancelled_with(self._driver.state, ids)
                       if c.status == "started"]
            # Logged here, bounded while the database is down (`_log_now`); if it is only
            # noted, it is still logged before anything else is decided, so no cancelled call
            # starts (and a start being committed meanwhile does not run: `_run_started`).
            # Stopping a running one is this process's own business: done at once.
            await self._log_now(CancellationArrived(ids, gen))
            for call_id in running:  # already running: stop it if pipecat can
                await self._cancel_function_calls_by_tool_call_id(call_id)
        sc = message.server_content
        if sc is None:
            return
        if sc.interrupted:
            self._turns_played = self._model_turns  # the transport drops the queued audio
            # Noted, not awaited: this is the receive loop, and the model's next audio is
            # behind it (seen: while PostgreSQL restarted, the answer to a barge-in played
            # only once the database was back).
            self._note(InterruptionObserved(gen))
        if sc.model_turn:
            self._last_speech_activity = time.monotonic()
        if sc.input_transcription and sc.input_transcription.text:
            self._transcript["user"].append(sc.input_transcription.text)
        if sc.output_transcription and sc.output_transcription.text:
            self._transcript["assistant"].append(sc.output_transcription.text)

    def _saw_reaction(self, message) -> None:
        """After a send as content: has the model reacted to it? Its first output of a turn
        begun after the send (a model at rest reacts only to what it is sent; a turn under
        way at the send may end first, and a handle may come in between)."""
        sc = message.server_content
        if self._turn_at_send:
            if sc is not None and (sc.turn_complete or sc.interrupted):
                self._turn_at_send = False  # that turn is over: the next one reacts to the send
            return
        if message.tool_call is not None or (sc is not None and (
                sc.model_turn or sc.output_transcription or sc.turn_complete)):
            self._handles_hold_sends = self._unread_send
            self._unread_send = 0

    def _sending_content(self, generation: int) -> None:
        """A seed or a result as content is about to go out on this session: its handles are
        withheld until the model reacts to it (ev.HandleWithheld)."""
        if self._handles_hold_sends == generation:
            self._handles_hold_sends = 0
        if self._unread_send != generation:
            self._turn_at_send = self._bot_is_responding
        else:
            self._turn_at_send = self._turn_at_send or self._bot_is_responding
        self._unread_send = generation

    async def _flush_transcript(self) -> None:
        events = []
        for role in ("user", "assistant"):
            text = "".join(self._transcript[role]).strip()
            self._transcript[role].clear()
            if text:
                events.append(ev.ConversationMessage(role, text, self._driver.state.generation))
        for event in events:
            self._note(event)

    # ------------------------------------------------------------------ tool calls
    async def _handle_msg_tool_call(self, message):
        gen = self._driver.state.generation
        calls = tuple(
            # Vertex sends no ids: make one, as upstream does, and persist it with the call
            # (the Gemini API always should: there the log also records the anomaly).
            FunctionCall(f.id or f"gen{gen}-{uuid.uuid4()}", f.name, jsonable(f.args or {}),
                         id_generated=not f.id,
                         has_handler=bool(f.name) and self.has_function(f.name))
            for f in (message.tool_call.function_calls or []))
        if calls:
            # Decided and logged with the start of every call now due (one commit), in order
            # with everything noted before, right here unless the log is busy; a database
            # that is down holds the audio behind the toolCall only briefly (`_log_now`).
            await self._log_now(ToolCallsArrived(calls, gen))
        else:
            self._note(ev.AnomalyRecorded("empty_tool_call", {}, gen))

    async def _on_rejected_frame(self, rejection: Rejection) -> None:
        """A frame the SDK could not parse (or parsed leaving fields out): logged; whether
        the session is resynced for it is decided on the log (decide.RESYNC_KINDS)."""
        if rejection.once is not None:
            if rejection.once in self._unknown_logged:
                return
            self._unknown_logged.add(rejection.once)
        logger.warning(f"{self}: server frame not taken in ({rejection.kind}): "
                       f"{str(rejection.detail)[:300]}")
        self._note(ServerMessageRejected(rejection.kind, rejection.detail,
                                         self._driver.state.generation))

    # ------------------------------------------------------------------ speech
    async def _set_bot_is_responding(self, responding: bool):
        if responding and not self._bot_is_responding:
            self._model_turns += 1
        await super()._set_bot_is_responding(responding)
        if responding:
            self._last_speech_activity = time.monotonic()
            # Upstream calls this right before pushing a turn's first audio frame: note it
            # (logged before anything decided after it) rather than wait for a commit here.
            self._note(SpeechStarted(self._driver.state.generation, "model"), lazy=True)

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):  # e.g. a local VAD barge-in, either way
            self._turns_played = self._model_turns  # the transport drops what was queued
            return
        if direction != FrameDirection.UPSTREAM:
            return
        # The transport's speech changes are noted, not awaited: system frames share one task
        # with the user's microphone audio, which must not wait for the database (seen: while
        # PostgreSQL restarted, an awaited stop held the user's audio back for the rest of
        # the outage). A noted fact is also never dropped when its append fails: it stays
        # queued, in order, until the log takes it (an awaited one was lost with the error).
        # With speaking_signal="model" the transport's frames only hold the watchdog off:
        # the model's turn decides. Counting both made the outcome depend on frame timing
        # (seen under load: the transport's start, noted after the turnComplete that ended
        # the turn, began the speech again and held a deferred call 2 s, until playback ended).
        if isinstance(frame, BotStartedSpeakingFrame):
            self._transport_speaking = True
            self._last_speech_activity = time.monotonic()
            if self._speaking_signal == "transport":
                self._note(SpeechStarted(self._driver.state.generation, "transport"), lazy=True)
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._transport_speaking = False
            if self._speaking_signal != "transport":
                return
            # Gemini streams faster than real time: when a turn's playback ends (its
            # TTSStoppedFrame), the next turn's audio may already be queued behind it, and the
            # transport starts again at once. That stop is not silence (seen on the wire: it
            # let a goAway reconnect cut the next turn). A stop without a turnComplete (the
            # transport's silence fallback while 3.x holds turnComplete) ends the current
            # turn, so it counts too: no deadlock.
            self._turns_played = min(self._turns_played + 1, self._model_turns)
            if self._turns_played >= self._model_turns:
                self._note_stop("transport")

    def _note_stop(self, source: str) -> None:
        """Speech stopped: logged at once if a call or a reconnect waits for it, else lazily
        (it then shares the next commit, and the one after the turn stays free for a
        toolCall)."""
        self._note(SpeechStopped(self._driver.state.generation, source),
                   lazy=not waits_for_silence(self._driver.state))

    async def _speech_watchdog(self) -> None:
        """Silence safety net for speech the transport never reported (no output transport,
        text-only turns). While the transport is playing it is not silence: Gemini sends audio
        faster than real time, so the last chunk can arrive seconds before playback ends (seen
        on the wire: a deferred call started 1.4 s before the audio finished). The transport
        itself always ends its stretch (TTSStoppedFrame, or its own 3 s fallback)."""
        pause = 0.25
        while True:
            await asyncio.sleep(pause)
            pause = 0.25
            silent_for = time.monotonic() - self._last_speech_activity
            # Not while facts wait to be logged: they go first (the transport's own stop may
            # be among them), and while the log is down the notes task is retrying them.
            if (self._driver.state.bot_speaking and not self._transport_speaking
                    and silent_for > self._speaking_timeout_s and not self._driver.has_notes):
                try:
                    # (A log that does not take it keeps it in the notes, which this waits for.)
                    await self._observe(SpeechStopped(self._driver.state.generation, "timeout"))
                except Exception as exc:  # noqa: BLE001 - never end the watchdog for the call
                    logger.exception(f"{self}: could not act on the end of speech: {exc}")
                    pause = 2.0

    # ------------------------------------------------------------------ settings
    async def _update_settings(self, delta):
        changed = await super()._update_settings(delta)
        if changed:
            keys = tuple(sorted(changed))
            # A key pipecat did not recognise lives in `extra` (its value was logged as null).
            extra = getattr(self._settings, "extra", None) or {}
            values = redact_settings({k: _plain(extra[k] if k in extra
                                                else getattr(self._settings, k, None))
                                      for k in keys})
            # Nothing in a Gemini Live setup applies to a running session: every change
            # needs a new one (buffered while the bot speaks).
            await self._observe(SettingsUpdate(keys, values, needs_reconnect=True))
        return changed


def base_prompt(prompt: str, composed: Any, base: Any) -> str:
    """The base of a logged prompt. The log holds the prompt as pipecat composed it (its base
    followed by the addons it appends: an app's appended instructions, tool guidance); its
    base is what pipecat must compose from again, or the addons would go in twice."""
    if isinstance(composed, str) and isinstance(base, str) and composed.startswith(base):
        addons = composed[len(base):]
        if addons and prompt.endswith(addons):
            return prompt[:len(prompt) - len(addons)]
    return prompt


def _plain(value: Any) -> Any:
    """A setting as plain JSON. Mappings, lists and models stay structured, so that
    redact_settings can still mask a secret nested in them by its key: str() of a dict, or
    of a pydantic model such as google-genai's HttpOptions, hides the key from it and logs
    the secret (seen: an api key header). An object of any other kind is logged by its type
    only, as its text may hold anything."""
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if type(value).__name__ == "NotGiven":
        return None
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, pydantic.BaseModel):
        return _plain(value.model_dump(mode="json", exclude_none=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    return f"<{type(value).__name__}>"

