"""A logged call as an offline reproduction (pure): what the model sent and when, what the
tools returned, and the comparison of a re-run's log with the original, decision by decision.

Everything here reads export lines (`export.export_line`), so a reproduction is built from
the same redacted view a ticket carries. Each stimulus (a model message, a tool's result, the
app's settings change, a crash) is tied to a *gate*: the last version of the commit before
the one that logged its effect. The runner (service/reproduction.py) releases a stimulus once
the re-run's log reaches its gate, so the re-run meets the same inputs in the same order.
"""

from __future__ import annotations

import bisect
import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..codec import field_defaults
from ..events import canonical_json
from ..heard import LATE_WORDS_S

REPRODUCE_SCHEMA = 1
SPEC_FILE = "reproduction.json"
LOG_FILE = "log.jsonl"
TEST_FILE = "test_reproduction.py"

# Values that differ on every run and decide nothing: who ran the call, the server's handle
# strings (compared by order of appearance), free-text diagnostics; and an observation's
# count of the events decided on it, which are compared themselves (so a difference is
# reported at the first event that differs, not at the observation before it).
_VOLATILE = {"session.opened": ("worker",), "session.worker_attached": ("worker",),
             "connection.disconnected": ("detail",), "anomaly.recorded": ("detail",),
             "decision.observed": ("events",),
             # The re-run's audio is the script's, arriving on its clock.
             "conversation.message": ("audio_s", "audio_from_us")}
_HANDLE_FIELDS = ("handle",)
#: The local server's audio chunk (service.local_live.Audio), and a pipeline lead no
#: message's audio outlasts (a takeover the log shows cutting nothing cuts nothing).
AUDIO_CHUNK_MS = 40.0
NO_CUT_LEAD_S = 3600.0
#: An observation's fields measured on the re-run's clock, or that older logs do not say.
_OBSERVED_VOLATILE = ("read_at_us", "if_due", "said_audio_s", "said_audio_from_us",
                      "handed_over_us")
# What a worker that took over does once the app's context reached it (what is due: calls
# to start, results and turns to send) or once its session is up.
_ACTS = ("tool.call_started", "tool.result_sending", "conversation.sending",
         "settings.context_sending", "connection.connected")


# What the model sent next, when the commit that logged it holds a transport stop before it.
_AFTER_STOP = ("speech.bot_started", "conversation.message", "tool.call_requested")

# A send's confirmation, logged once the send returned (its intent is in an earlier commit).
_SENT = ("tool.result_sent", "conversation.sent")


@dataclass(frozen=True)
class Decision:
    """A run of the log's events the re-run is compared in: one logged decision (its
    `decision.observed` and the events decided on it), or the rest of a commit (what the
    service decided itself: intents, outcomes)."""

    first: int
    last: int
    lines: tuple[dict[str, Any], ...]

    @property
    def observation(self) -> str:
        """What the decision was taken on, as far as the log shows it."""
        head = self.lines[0]
        data = head["data"]
        if head["type"] == "decision.observed":
            seen = data.get("data") or {}
            ids = [c.get("call_id") for c in seen.get("calls", ()) if isinstance(c, dict)]
            ids += [seen["call_id"]] if isinstance(seen.get("call_id"), str) else []
            ids += [i for i in seen.get("call_ids", ()) if isinstance(i, str)]
            gen = seen.get("generation")
            return (str(data.get("kind")) + "".join(f" {i}" for i in ids)
                    + (f" (generation {gen})" if gen is not None else ""))
        gen = data.get("generation")
        return head["type"] + (f" (generation {gen})" if gen is not None else "")


def commits(lines: list[dict[str, Any]]) -> list[Decision]:
    """The log's commits: runs of version-contiguous events committed together (one
    recorded_at_us). The unit a reproduction's stimuli are gated on."""
    out: list[Decision] = []
    run: list[dict[str, Any]] = []
    for line in lines:
        if run and (line["recorded_at_us"] != run[-1]["recorded_at_us"]
                    or line["version"] != run[-1]["version"] + 1):
            out.append(Decision(run[0]["version"], run[-1]["version"], tuple(run)))
            run = []
        run.append(line)
    if run:
        out.append(Decision(run[0]["version"], run[-1]["version"], tuple(run)))
    return out


def decisions(lines: list[dict[str, Any]]) -> list[Decision]:
    """The log's decisions, the unit a divergence is reported in: each commit split at its
    logged observations (`decision.observed` with the events decided on it); what else the
    commit holds stays one group. A log written before `decision.observed` is compared by
    commit. The one place that says what a decision is."""
    out: list[Decision] = []
    for commit in commits(lines):
        rest: list[dict[str, Any]] = []
        i, group = 0, commit.lines
        while i < len(group):
            line = group[i]
            if line["type"] != "decision.observed":
                rest.append(line)
                i += 1
                continue
            if rest:
                out.append(Decision(rest[0]["version"], rest[-1]["version"], tuple(rest)))
                rest = []
            count = line["data"].get("events")
            span = group[i:i + 1 + (count if isinstance(count, int) and count >= 0 else 0)]
            out.append(Decision(span[0]["version"], span[-1]["version"], tuple(span)))
            i += len(span)
        if rest:
            out.append(Decision(rest[0]["version"], rest[-1]["version"], tuple(rest)))
    return out


# ------------------------------------------------------------------ comparison

#: Fields today's service fills from a decision whose observation a log may not hold (a
#: seed's `answer`, decided since SeedAsked): a log without that kind compares without them.
_DECIDED_WITH = {"conversation.sending": ("answer", "SeedAsked")}


def comparable(lines: list[dict[str, Any]], *, ignore_prompt_hash: bool = False,
               logged: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """Each line's type and data without what differs on every run (and, given the kinds of
    observation the log holds, `logged`, without what it never decided on the log)."""
    handles: dict[str, str] = {}
    out = []
    taken_over = False  # the line before was a TakenOver observation
    for line in lines:
        # As the catalogue reads it: a field added since the log was written takes its
        # default, so an older log compares with today's re-run on what both say.
        data = {**field_defaults(line["type"]), **line["data"]}
        for key in _VOLATILE.get(line["type"], ()):
            data.pop(key, None)
        field_, kind = _DECIDED_WITH.get(line["type"], ("", ""))
        if logged is not None and field_ and kind not in logged:
            data.pop(field_, None)
        for key in _HANDLE_FIELDS:
            if isinstance(data.get(key), str):
                data[key] = handles.setdefault(data[key], f"handle#{len(handles) + 1}")
        _round_time_left(data)
        if line["type"] == "decision.observed" and isinstance(data.get("data"), dict):
            # The observation as read: when it was read is the re-run's clock, and a
            # goAway's time left is measured then (decide counts the deadline from it).
            # `if_due` marks a planned leave, which logs from before it do not say.
            seen = {k: v for k, v in data["data"].items() if k not in _OBSERVED_VOLATILE}
            _round_time_left(seen)
            if isinstance(seen.get("words"), list):
                # When the caller's words came decides only whether they are late (within
                # LATE_WORDS_S of the bot's message): that is compared, not the seconds.
                seen["words"] = [[w[0], None if w[1] is None else w[1] < LATE_WORDS_S]
                                 if isinstance(w, list) and len(w) == 2
                                 and isinstance(w[1], (int, float, type(None))) else w
                                 for w in seen["words"]]
            data["data"] = seen
        if ignore_prompt_hash:
            data.pop("system_instruction_sha256", None)
        if taken_over and line["type"] == "conversation.message_cut":
            # How many words a takeover leaves heard is a matter of milliseconds on the
            # re-run's clock (the re-run takes over as long after the audio, give or take):
            # that it cut the message is compared, not where.
            data["text"] = "(cut at the takeover)"
        taken_over = (line["type"] == "decision.observed"
                      and line["data"].get("kind") == "TakenOver")
        out.append({"type": line["type"], "data": data})
    return out


def _round_time_left(data: dict[str, Any]) -> None:
    if isinstance(data.get("time_left_s"), (int, float)):  # measured on arrival
        data["time_left_s"] = round(data["time_left_s"], 1)


@dataclass(frozen=True)
class Divergence:
    decision: Decision  # the logged decision the re-run first decides otherwise
    expected: list[dict[str, Any]]
    actual: list[dict[str, Any]]
    version: int  # the first version whose event differs

    def message(self) -> str:
        d = self.decision
        span = f"v{d.first}" if d.first == d.last else f"v{d.first}–{d.last}"
        i = self.version - d.first
        want = self.expected[i]["type"] if i < len(self.expected) else "nothing"
        got = self.actual[i]["type"] if i < len(self.actual) else "nothing"
        return (f"first divergence at decision {span} ({d.observation}): at v{self.version} "
                f"the log has {want}, today's service {got}\n"
                f"  expected: {json.dumps(self.expected, sort_keys=True)}\n"
                f"  actual:   {json.dumps(self.actual, sort_keys=True)}")


# Events that name a version of their own log: renumbered with the re-run's (`as_logged`).
_VERSION_FIELDS = {"conversation.sending": "through", "conversation.sent": "through",
                   "settings.context_sending": "version", "settings.context_sent": "version",
                   "conversation.cut_telling": "cut", "conversation.cut_told": "cut",
                   "conversation.cut_untold": "cut"}


#: Event types today's service logs that a log written before them lacks altogether (the
#: handles' gate, session_store.withholding): a log holding none of them reproduces without.
LATER_TYPES = frozenset({"connection.send_unread", "connection.earlier_turn_ended",
                         "connection.model_reacted", "connection.holds_all"})


def observed_kinds(lines: list[dict[str, Any]]) -> frozenset[str]:
    """What of today's logging the log holds: the kinds of observation it records
    (`decision.observed`), and LATER_TYPES if it has any of them (written by code that logs
    them all: one it lacks, it had no cause to log)."""
    kinds = {line["data"].get("kind") for line in lines if line["type"] == "decision.observed"}
    if any(line["type"] in LATER_TYPES for line in lines):
        kinds |= LATER_TYPES
    return frozenset(kinds)


def unlogged_observation(event_type: str, kind: Any, logged: frozenset[str]) -> bool:
    """An observation today's service logs of a kind the log never holds, or an event of a
    LATER_TYPES type it never holds: a log written before that kind was logged (results,
    handles, say) reproduces without it."""
    if event_type in LATER_TYPES:
        return event_type not in logged
    return event_type == "decision.observed" and kind not in logged


def as_logged(actual: list[dict[str, Any]], logged: frozenset[str]) -> list[dict[str, Any]]:
    """The re-run's lines without its unlogged observations, numbered as the log numbers
    them: each version, and each version an event names, less the observations before it."""
    dropped = [line["version"] for line in actual
               if unlogged_observation(line["type"], line["data"].get("kind"), logged)]
    if not dropped:
        return actual

    def shift(version: int) -> int:
        return version - bisect.bisect_right(dropped, version)

    out = []
    for line in actual:
        if unlogged_observation(line["type"], line["data"].get("kind"), logged):
            continue
        line = {**line, "version": shift(line["version"])}
        name = _VERSION_FIELDS.get(line["type"])
        if name is not None and isinstance(line["data"].get(name), int):
            line["data"] = {**line["data"], name: shift(line["data"][name])}
        out.append(line)
    return out


def first_divergence(expected: list[dict[str, Any]], actual: list[dict[str, Any]], *,
                     ignore_prompt_hash: bool = False) -> Divergence | None:
    """The first logged decision whose events the re-run does not log alike, or None.
    Events are compared in order, so a re-run that commits the same events in other
    groupings (timing) agrees; the report names the logged decision holding the first
    event that differs, with the re-run's events at the same versions.
    The re-run is read as the log numbers it (`as_logged`)."""
    logged = observed_kinds(expected)
    actual = as_logged(actual, logged)
    want = comparable(expected, ignore_prompt_hash=ignore_prompt_hash, logged=logged)
    got = comparable(actual, ignore_prompt_hash=ignore_prompt_hash, logged=logged)
    at = next((i for i, (a, b) in enumerate(zip(want, got)) if canonical_json(a)
               != canonical_json(b)), None)
    if at is None:
        if len(want) == len(got):
            return None
        at = min(len(want), len(got))
    groups = decisions(expected)
    if at >= len(want):  # the re-run logged more than the call did
        last = expected[-1]["version"] if expected else 0
        extra = Decision(last + 1, len(actual), tuple(actual[at:]))
        return Divergence(extra, [], got[at:at + 5], last + 1)
    version = expected[at]["version"]
    d = next(g for g in groups if g.first <= version <= g.last)
    lo, hi = d.first - expected[0]["version"], d.last - expected[0]["version"] + 1
    return Divergence(d, want[lo:hi], got[lo:hi], version)


# ------------------------------------------------------------------ the reproduction

@dataclass
class _Builder:
    lines: list[dict[str, Any]]
    connections: list[dict[str, Any]] = field(default_factory=list)
    by_generation: dict[int, dict[str, Any]] = field(default_factory=dict)
    not_reproduced: list[str] = field(default_factory=list)
    # generation -> (the last version of its goAway's commit, that goAway's gate)
    go_away: dict[int, tuple[int, int]] = field(default_factory=dict)
    # In the commit being read, after a transport stop of (generation, its playback's gate):
    # that generation's steps came after the stop (`after_played`).
    after_stop: tuple[int, int] | None = None

    def step(self, generation: int, gate: int, name: str, *, before: int | None = None,
             **args: Any) -> None:
        """The step `name` for `generation`'s connection once the log reaches `gate`; at
        position `before` of its steps if given (else last)."""
        conn = self.by_generation.get(generation)
        if conn is None:
            self.not_reproduced.append(f"{name} on generation {generation}, which the log "
                                       f"never connected")
            return
        after, go_away_gate = self.go_away.get(generation, (None, None))
        if gate == after and go_away_gate is not None:
            # What the model sent right behind a goAway was on the socket before the goAway
            # was committed (the service's reconnect, decided after that commit, found the
            # bot speaking again): it goes out with the goAway, not after its commit.
            gate = go_away_gate
        step: dict[str, Any] = {"at": gate, "step": name, "args": args}
        if self.after_stop is not None and self.after_stop[0] == generation:
            step["after_played"] = self.after_stop[1]
        if before is None:
            conn["steps"].append(step)
        else:
            conn["steps"].insert(before, step)

    def position(self, generation: int) -> int | None:
        """Where the next step of `generation`'s connection goes (None: not connected)."""
        conn = self.by_generation.get(generation)
        return None if conn is None else len(conn["steps"])


def noted_tool_calls(commit: Decision) -> list[int]:
    """The generations whose toolCall in this commit was noted, not committed on arrival.
    The receive loop commits a toolCall at once unless another commit holds the log, and
    reads nothing behind it until that is done: an observation logged after the toolCall's
    in the same commit shows it waited, so it came in while the commit before was in
    flight. (A log without `decision.observed` shows nothing: none.)"""
    out: list[int] = []
    for i, line in enumerate(commit.lines):
        d = line["data"]
        if line["type"] == "decision.observed" and d.get("kind") == "ToolCallsArrived" \
                and any(x["type"] == "decision.observed" for x in commit.lines[i + 1:]):
            gen = (d.get("data") or {}).get("generation")
            if isinstance(gen, int):
                out.append(gen)
    return out


def build(lines: list[dict[str, Any]], *, redacted: bool = False) -> dict[str, Any]:
    """The reproduction of a call from its export lines (see the module docstring)."""
    if not lines or lines[0]["type"] != "session.opened":
        raise ValueError("the log does not start with session.opened: not a whole call")
    b = _Builder(lines)
    opened = lines[0]["data"]
    workers: list[dict[str, Any]] = [{"epoch": opened.get("epoch", 1), "last_version": None,
                                      "start_at": None}]
    first_act = False  # a worker took over and has not acted yet
    user_turns: list[dict[str, str]] = []
    settings_changes: list[dict[str, Any]] = []
    playback: list[dict[str, int]] = []
    tools: dict[str, list[dict[str, Any]]] = {}  # call id -> its runs' outcomes
    checks: dict[str, dict[str, Any]] = {}  # call id -> the outcome check's answer
    keys: dict[str, str] = {}
    modes: dict[str, str] = {}
    idempotent: set[str] = set()
    rerun: set[str] = set()
    names: dict[str, str] = {}
    end_at: int | None = None
    generation = 0
    checked_done: set[str] = set()
    turn_ended: set[int] = set()
    audio_on: set[int] = set()  # generations the model has sent audio on
    chunks: dict[int, int] = {}  # generation -> audio chunks sent since its last message
    # The bot's last message while its audio may still play: (its first audio's time, the
    # version of its message), for the takeover that cuts it (TakenOver).
    playing: tuple[int, int] | None = None
    # generation -> where the audio of its turn under way went in its steps: the caller's
    # words that came while the bot's last message still stood came before it.
    turn_audio: dict[int, int] = {}
    words_stood = False  # the flush being read had words that came while a message stood
    speaking = False  # the bot speaks, as the log has it
    prev_last, prev_gate, after_connect = 0, 0, False
    prev_lines: tuple[dict[str, Any], ...] = ()  # the commit before this one
    connected_at: dict[int, int] = {}  # generation -> the version of its connection.connected
    for group in commits(lines):
        gate = prev_last
        b.after_stop = None
        # A result logged right after a new session connected, before its seed, came in
        # while the session's start was being committed: it waited for that commit, and
        # the seed for it. It is released while the re-run commits that start (released
        # after it, the seed, decided at once, always goes first).
        result_gate = prev_gate if after_connect else gate
        during = {"during_commit": True} if after_connect else {}
        calls: dict[int, list[dict[str, Any]]] = {}  # generation -> this commit's toolCall
        marks = {g: len(c["steps"]) for g, c in b.by_generation.items()}
        for line in group.lines:
            t, d, v = line["type"], line["data"], line["version"]
            gen = d.get("generation", generation)
            if first_act and t == "connection.connected":
                # The new worker started and sent nothing before its session was up (what
                # it settles on attaching, in-doubt calls, does not wait for the app): the
                # app's first context reached it while the session's start was being
                # committed (earlier, its seed would have found no session and started what
                # was due at once; later, the session would have sent what was due with
                # that start). It is released while the re-run commits the session's start.
                workers[-1]["start_at"] = gate
            if first_act and t in _ACTS:
                first_act = False
            if t == "connection.connected":
                generation = d["generation"]
                connected_at[generation] = v
                conn = {"generation": generation, "refuse": None, "steps": []}
                b.connections.append(conn)
                b.by_generation[generation] = conn
            elif t == "connection.handle_refused" and d.get("reason") == "refused":
                b.connections.append({"generation": None, "refuse": "handle", "steps": []})
            elif t == "connection.disconnected" and d["reason"] == "handshake_failed":
                b.connections.append({"generation": None, "refuse": 1011, "steps": []})
            elif t == "connection.disconnected" and d["reason"] == "error":
                b.step(gen, gate, "Close", code=1011, reason="closed as logged")
            elif t == "connection.disconnected" and d["reason"] == "shutdown":
                end_at = gate if end_at is None else end_at
            elif t == "session.closed":
                end_at = gate if end_at is None else end_at
            elif t == "session.worker_attached":
                workers[-1]["last_version"] = v - 1
                # Whether it cut the bot's message still playing depends on how long after
                # that message's first audio it took over: the re-run's worker takes over
                # as long after (on the re-run's clock). With no cut logged, it is told its
                # pipeline writes far ahead, so it cuts nothing either.
                workers.append({"epoch": d["epoch"], "last_version": None,
                                "start_at": None, "playback_lead_s": NO_CUT_LEAD_S})
                if playing is not None:
                    workers[-1]["after_audio_us"] = line["recorded_at_us"] - playing[0]
                first_act = True
            elif t == "decision.observed" and d.get("kind") == "TranscriptFlushed":
                words = (d.get("data") or {}).get("words") or []
                words_stood = any(isinstance(w, list) and len(w) == 2 and w[1] is not None
                                  for w in words)
            elif t == "decision.observed" and d.get("kind") == "TakenOver":
                taken = d.get("data") or {}
                workers[-1]["playback_lead_s"] = taken.get("playback_lead_s", 0.0)
                # Cut as of the hand-over, when logged: the re-run (which has none) takes
                # over that long after the audio instead.
                handed_over = taken.get("handed_over_us")
                if handed_over is not None and playing is not None:
                    workers[-1]["after_audio_us"] = min(workers[-1].get("after_audio_us", 1 << 62),
                                                        handed_over - playing[0])
            elif t == "conversation.message" and d["role"] == "user" and gen == 0:
                user_turns.append({"role": "user", "content": d["text"]})
            elif t == "conversation.message" and d["role"] == "assistant":
                # The service logs the model's words when its turn completes: the turn
                # ends here (the bot goes on playing its audio until its stop's gate). A
                # turn whose audio came while the bot was still speaking logged no start
                # of its own (it decided nothing), yet it had audio: without it the
                # transport plays one turn fewer than the service counts, and the bot's
                # speech ends on the silence timeout instead of the transport's stop.
                if speaking and (gen in turn_ended or gen not in audio_on):
                    b.step(gen, gate, "Audio", chunks=1)
                    audio_on.add(gen)
                    chunks[gen] = chunks.get(gen, 0) + 1
                if d.get("audio_s"):
                    # As long as the logged audio: a takeover judges what it cut by it.
                    missing = round(d["audio_s"] * 1000 / AUDIO_CHUNK_MS) - chunks.get(gen, 0)
                    if missing > 0:
                        b.step(gen, gate, "Audio", chunks=missing)
                    playing = (d["audio_from_us"], v) if d.get("audio_from_us") else None
                chunks[gen] = 0
                turn_audio.pop(gen, None)
                b.step(gen, gate, "OutputTranscript", text=d["text"])
                b.step(gen, gate, "TurnComplete")
                turn_ended.add(gen)
            elif t == "conversation.message":
                # Words that came while the bot's last message stood (their `since` is
                # known) came before the audio of the turn now under way.
                b.step(gen, gate, "InputTranscript", text=d["text"],
                       before=turn_audio.get(gen) if words_stood else None)
            elif t == "speech.bot_started":
                speaking = True
                if d.get("source") == "model":
                    at = b.position(gen)
                    if at is not None:
                        turn_audio[gen] = at
                    b.step(gen, gate, "Audio", chunks=1)
                    audio_on.add(gen)
                    turn_ended.discard(gen)
                    chunks[gen] = chunks.get(gen, 0) + 1
            elif t == "speech.bot_stopped" and d.get("source") == "transport":
                speaking, playing = False, None
                if gen not in turn_ended:
                    b.step(gen, gate, "TurnComplete")
                playback.append({"from": gate, "until": v})
                if any(x["version"] > v and x["type"] in _AFTER_STOP for x in group.lines):
                    # The model's next output is in this commit, behind the stop: it came
                    # after the playback ended (noted first), so the server sends it once
                    # the re-run's transport stopped.
                    playback[-1]["steps_after"] = True
                    b.after_stop = (gen, gate)
                if any(x["type"] in _SENT for x in group.lines if x["version"] > v):
                    # A send confirmed behind the stop in its commit was under way when the
                    # stop came: the playback ends before the re-run's send intent returns.
                    playback[-1]["during_send"] = True
            elif t == "speech.bot_stopped" and d.get("source") == "turn_complete":
                speaking = False
                b.step(gen, gate, "TurnComplete")
            elif t == "speech.bot_stopped":
                speaking, playing = False, None
            elif t == "speech.interrupted":
                b.step(gen, gate, "Interrupted")
                playing = None
            elif t == "model.interaction_status" and d.get("source") == "server":
                b.step(gen, gate, "InteractionStatus", status=d["status"])
            elif t == "connection.go_away":
                b.step(gen, gate, "GoAway", time_left=d["time_left_s"], close_code=None)
                b.go_away[gen] = (group.last, gate)
            elif t in ("connection.handle_issued", "connection.handle_withheld"):
                b.step(gen, gate, "ResumptionUpdate", resumable=True)
            elif t == "conversation.message_cut":
                playing = None
            elif t == "tool.call_requested":
                names[d["call_id"]] = d["name"]
                modes[d["name"]] = d.get("declared") or modes.get(d["name"], "BLOCKING")
                if gen not in calls:
                    # One toolCall per generation and commit (parallel calls come in one),
                    # sent where its first call is in the commit: a fact logged after it
                    # (a resumption handle) came in after it.
                    calls[gen] = []
                    b.step(gen, gate, "ToolCall", calls=calls[gen])
                calls[gen].append({"id": d["call_id"], "name": d["name"], "args": d["args"]})
            elif t == "tool.call_cancelled" and d["reason"] == "server":
                b.step(generation, gate, "CancelToolCalls", ids=[d["call_id"]])
            elif t == "settings.changed":
                settings_changes.append({"at": gate, "values": d["values"]})
            elif t == "tool.call_started":
                keys[d["idempotency_key"]] = d["call_id"]
                tools.setdefault(d["call_id"], []).append({"attempt": d["attempt"],
                                                           "outcomes": []})
                if d["attempt"] > 1 and d["call_id"] not in checks:
                    idempotent.add(names.get(d["call_id"], ""))
                elif d["attempt"] > 1:
                    rerun.add(names.get(d["call_id"], ""))
            elif t == "tool.outcome_checked":
                checks[d["call_id"]] = {"answer": d["answer"], "detail": d.get("detail", "")}
                if d["answer"] == "done":
                    checked_done.add(d["call_id"])
            if t == "tool.call_completed" and d.get("reused_from") is None:
                if d["call_id"] in checked_done:
                    checked_done.discard(d["call_id"])
                    checks[d["call_id"]]["result"] = d["result"]
                elif d["call_id"] in tools:
                    tools[d["call_id"]][-1]["outcomes"].append(
                        {**during, "at": result_gate, "kind": "result", "value": d["result"]})
            elif t == "tool.call_progress" and d["call_id"] in tools:
                tools[d["call_id"]][-1]["outcomes"].append(
                    {**during, "at": result_gate, "kind": "progress", "value": d["result"]})
            elif t == "tool.call_failed" and not d.get("outcome_unknown") \
                    and d["call_id"] in tools:
                tools[d["call_id"]][-1]["outcomes"].append(
                    {**during, "at": result_gate, "kind": "error", "value": d["error"]})
            elif t == "anomaly.recorded":
                b.not_reproduced.append(f"v{v}: anomaly {d.get('kind')} (the log keeps its "
                                        f"kind, not the message that caused it)")
        for noted in noted_tool_calls(group):
            # It came in while the commit before was in flight, and what this commit logged
            # of its connection with it (before it, and the handle right behind it) came in
            # then too: all of it is released while the re-run commits the commit before.
            steps = b.by_generation[noted]["steps"] if noted in b.by_generation else []
            for s in steps[marks.get(noted, 0):]:
                if s["at"] == gate:
                    s.update(at=prev_gate, during_commit=True)
            if workers[-1]["start_at"] is None and noted in connected_at and any(
                    x["type"] == "conversation.sent" and x["data"].get("via") == "seed"
                    for x in prev_lines):
                # The commit before was the session's seed, and the receive loop read the
                # toolCall meanwhile: the seed ran on the app's first context, not in the
                # session's start (which holds the receive loop), so that context came after.
                workers[-1]["context_after"] = connected_at[noted]
        prev_last, prev_gate, prev_lines = group.last, gate, group.lines
        after_connect = group.lines[-1]["type"] == "connection.connected"
    settings = opened.get("settings", {})
    return {"reproduce_schema": REPRODUCE_SCHEMA, "call": lines[0]["call"],
            "model": opened["model"], "settings": settings, "tools": opened["tools"],
            "tool_modes": modes, "redacted": redacted, "user_turns": user_turns,
            "connections": b.connections, "workers": workers,
            "settings_changes": settings_changes, "playback": playback, "end_at": end_at,
            "tool_runs": tools, "outcome_checks": checks, "idempotency_keys": keys,
            "idempotent": sorted(n for n in idempotent if n),
            "rerun_if_not_done": sorted(n for n in rerun if n),
            "checked": sorted({names[c] for c in checks if c in names}),
            "not_reproduced": b.not_reproduced}


_TEST = string.Template('''"""Reproduction of call $call (written by `session-store reproduce`).

Runs today's DurableGeminiLiveLLMService in a real pipecat pipeline against the local
Gemini Live server playing what the model sent in the log, with the tools returning what
the log says they returned, and compares the decisions with the log's, one by one.
Run: pytest $test_file   (REPRODUCE_DB=postgresql+asyncpg://... to re-run on PostgreSQL)
"""

import os
from pathlib import Path

import pytest

from service.reproduction import run_reproduction

pytestmark = pytest.mark.asyncio
HERE = Path(__file__).parent


async def test_todays_service_decides_as_the_log(tmp_path):
    db = os.environ.get("REPRODUCE_DB") or f"sqlite+aiosqlite:///{tmp_path / 'repro.db'}"
    result = await run_reproduction(HERE, db, schema=os.environ.get("REPRODUCE_SCHEMA"))
    assert result.divergence is None, result.divergence.message()
''')


def write(directory: Path, lines: list[dict[str, Any]], *, redacted: bool = False
          ) -> dict[str, Any]:
    """Write the reproduction of a call into `directory` (created): the spec, the log it
    is compared with, and the pytest file."""
    spec = build(lines, redacted=redacted)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SPEC_FILE).write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n",
                                       encoding="utf-8")
    with open(directory / LOG_FILE, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, sort_keys=True) + "\n")
    (directory / TEST_FILE).write_text(_TEST.substitute(call=spec["call"], test_file=TEST_FILE),
                                       encoding="utf-8")
    return spec


def read(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = json.loads((directory / SPEC_FILE).read_text(encoding="utf-8"))
    if spec.get("reproduce_schema") != REPRODUCE_SCHEMA:
        raise ValueError(f"{directory / SPEC_FILE}: reproduce_schema "
                         f"{spec.get('reproduce_schema')!r}, this code reads {REPRODUCE_SCHEMA}")
    with open(directory / LOG_FILE, encoding="utf-8") as f:
        lines = [json.loads(x) for x in f if x.strip()]
    return spec, lines
