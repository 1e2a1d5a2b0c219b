"""The reading side of a connection: every client frame recorded, judged and taken in.

It runs synchronously in the server's receive loop: a frame is decoded and recorded, then
its effect on the model state applied (results judged against what the model knows,
content and context updates taken in), and the connection's script triggers fired. What
a generation refuses is returned as a :class:`~.profiles.Refusal` for the server to close on.
"""

from __future__ import annotations

import json
import time
from typing import Any

from . import profiles, protocol
from .profiles import Profile, Refusal
from .model_state import (
    ConversationEntry,
    ModelState,
    ToolResult,
    Verdict,
    admit,
    judge_content_result,
    judge_tool_response,
)
from .record import ClientMessage, Connection
from .server_record import ServerRecord
from .session import LiveSession


class Intake:
    """Takes one server's client frames into its records and its connections' model states."""

    def __init__(self, shared: ServerRecord, keep_audio: bool) -> None:
        self.shared = shared
        self.keep_audio = keep_audio

    def initial_state(self, record: Connection, profile: Profile) -> ModelState:
        """A fresh session knows its setup only; a resumed one knows what its handle captured.

        A resumed session keeps the handle's system instruction and tools and ignores the
        setup's (noted when they differ): whether a resumed session adopts a new prompt
        from its setup is undocumented, so a client must not rely on it. On a profile that
        loses context on resumption with a long system instruction, it starts fresh.
        """
        fresh = ModelState(
            system_instruction=record.system_instruction,
            tools=protocol.declared_behaviors(record.setup.get("tools") if record.setup else None),
        )
        handle = record.resumption_handle
        if handle is None:
            return fresh
        issued = self.shared.handles.get(handle)
        if issued is None:
            self.shared.add_violation(
                "unknown_resumption_handle", record.index, None, f"handle {handle!r} never issued"
            )
            return fresh
        record.resumed_from = handle
        limit = profile.resume_context_limit_tokens
        tokens = profiles.token_count(issued.state.system_instruction)
        if limit is not None and tokens > limit:
            record.notes.append({
                "kind": "context_lost_on_resume",
                "detail": f"handle {handle}: its system instruction is about {tokens} tokens "
                          f"(over {limit}); Gemini {profile.name} restores nothing",
            })
            return fresh
        state = issued.state.snapshot()
        if fresh.system_instruction != state.system_instruction:
            record.notes.append({
                "kind": "setup_prompt_ignored",
                "detail": f"resumed from {handle}: the session keeps the handle's system "
                          "instruction; the setup's differs and was ignored",
            })
        if fresh.tools != state.tools:
            record.notes.append({
                "kind": "setup_tools_ignored",
                "detail": f"resumed from {handle}: the session keeps the handle's tools "
                          f"{state.tool_names}; the setup's {fresh.tool_names} were ignored",
            })
        return state

    def record_frame(self, record: Connection, frame: str | bytes) -> ClientMessage | None:
        """Decode, normalise and record one client frame; None if it was malformed."""
        index = len(record.received)
        try:
            text = frame.decode("utf-8") if isinstance(frame, bytes) else frame
            decoded = json.loads(text)
            if not isinstance(decoded, dict):
                raise ValueError("a client message must be a JSON object")
        except ValueError as error:
            shown = frame if isinstance(frame, str) else repr(frame)
            record.received.append(ClientMessage(index, "malformed", shown, time.time()))
            self.shared.add_violation("malformed_client_message", record.index, None, f"{error}: {shown[:200]}")
            return None
        message = protocol.normalise(decoded)
        kind = protocol.message_kind(message)
        body = message if kind == "unknown" else message[kind]
        if not self.keep_audio and kind == "realtime_input":
            body = protocol.summarise_audio(body)
        recorded = ClientMessage(index, kind, body, time.time())
        record.received.append(recorded)
        if kind == "unknown":
            self.shared.add_violation(
                "unknown_client_message", record.index, None, f"keys {sorted(message)}"
            )
        self.shared.notify()
        return recorded

    def apply(self, session: LiveSession, message: ClientMessage) -> Refusal | None:
        """Take a client message into the model state and fire the script's triggers.

        Returns why the connection must close instead, when its generation refuses it.
        """
        body = message.body if isinstance(message.body, dict) else {}
        record = session.record
        state = record.state
        if message.kind == "tool_response":
            refusal = profiles.refuse_scheduling(session.profile,
                                                 body.get("function_responses") or [])
            if refusal is not None:
                return refusal
            for response in body.get("function_responses") or []:
                if response.get("will_continue") is True \
                        and not session.profile.intermediate_results:
                    self.shared.add_violation(
                        "intermediate_unsupported", record.index, response.get("id"),
                        f"Gemini {session.profile.name} abandons a call after an "
                        "intermediate result: its final result would never be spoken")
                self._take_result(
                    session, message, response.get("id"), str(response.get("name", "")),
                    response.get("response", {}), "tool_response",
                    will_continue=response.get("will_continue"),
                    scheduling=response.get("scheduling"),
                )
        elif message.kind == "client_content":
            refusal = profiles.refuse_client_content(
                session.profile,
                history_in_client_content=profiles.history_in_client_content(record.setup or {}),
                model_output_sent=record.model_output_at is not None,
                resumed=record.resumption_handle is not None,
            )
            if refusal is not None:
                return refusal
            turns = body.get("turns") or []
            complete = bool(body.get("turn_complete"))
            state.history_calls.extend(protocol.content_calls(turns))
            state.conversation.extend(  # a blank turn only satisfies 2.5's seed shape
                ConversationEntry(role, text, "content")
                for role, text in protocol.content_texts(turns) if text.strip()
            )
            for found in protocol.content_results(turns):
                self._take_content(session, message, found, "content", acted_on=complete)
            if complete:
                # The turn is complete: Gemini now goes on with every result it was given
                # as content meanwhile (turnComplete false only adds to the context).
                self._complete_turn(session)
                session.trigger("turn_complete")
        elif message.kind == "realtime_input" and isinstance(body.get("text"), str):
            # Realtime text is acted on at once, like content with turnComplete.
            text = body["text"]
            results = protocol.text_results(text)
            for result in results:
                self._take_content(session, message, result, "realtime")
            if not results and text.strip():  # a blank text is pipecat's nudge, not a turn
                state.conversation.append(ConversationEntry("user", text, "realtime"))
            self._complete_turn(session)
            if not results and text.strip():
                session.trigger("realtime_text")
        elif message.kind == "context_update":
            refusal = profiles.refuse_context_update(session.profile)
            if refusal is None:
                refusal = self._update_context(session, message, body)
            if refusal is not None:
                return refusal
        self.shared.notify()
        return None

    def _complete_turn(self, session: LiveSession) -> None:
        state = session.record.state
        waited = bool(state.awaiting_turn)
        state.awaiting_turn.clear()
        if waited and not state.blocking_outstanding():
            session.trigger("tool_result")

    def _update_context(
        self, session: LiveSession, message: ClientMessage, body: dict[str, Any]
    ) -> Refusal | None:
        """Apply a ``contextUpdate``: a new system instruction and/or tool list, in order."""
        state = session.record.state
        applied: dict[str, Any] = {
            "connection": session.record.index, "client_message_index": message.index,
            "at": message.at,
        }
        if "tools" in body:  # present even when empty: an empty list clears the tools
            behaviors = protocol.declared_behaviors((body["tools"] or {}).get("tools") or [])
            refusal = profiles.refuse_declarations(session.profile, behaviors)
            if refusal is not None:
                return refusal
            state.tools = behaviors
            applied["tool_names"] = list(behaviors)
        if "system_instruction" in body:
            state.system_instruction = protocol.instruction_text(body["system_instruction"])
            applied["system_instruction"] = state.system_instruction
        state.context_updates.append(applied)
        return None

    def _take_content(
        self, session: LiveSession, message: ClientMessage, found: protocol.ContentResult,
        via: str, acted_on: bool = True,
    ) -> None:
        verdict = judge_content_result(session.record.state, found)
        self._admit(session, message, verdict, found.call_id, found.name, found.response, via,
                    acted_on=acted_on)

    def _take_result(
        self,
        session: LiveSession,
        message: ClientMessage,
        call_id: str | None,
        name: str,
        response: Any,
        via: str,
        will_continue: bool | None = None,
        scheduling: str | None = None,
    ) -> None:
        response = protocol.as_response_dict(response)
        if scheduling is None and isinstance(response.get("scheduling"), str):
            scheduling = response["scheduling"]  # pipecat also writes it inside the response
        verdict = judge_tool_response(
            session.record.state, call_id, name, will_continue, response
        )
        self._admit(session, message, verdict, call_id, name, response, via,
                    will_continue=will_continue, scheduling=scheduling)

    def _admit(
        self,
        session: LiveSession,
        message: ClientMessage,
        verdict: Verdict,
        client_id: str | None,
        name: str,
        response: Any,
        via: str,
        *,
        acted_on: bool = True,
        will_continue: bool | None = None,
        scheduling: str | None = None,
    ) -> None:
        record = session.record
        state = record.state
        result = ToolResult(
            connection=record.index,
            id=verdict.call_id,
            name=name,
            response=response,
            via=via,
            accepted=verdict.accepted,
            client_message_index=message.index,
            at=message.at,
            final=verdict.final,
            will_continue=will_continue,
            scheduling=scheduling,
        )
        record.results.append(result)
        for kind, detail in verdict.violations:
            self.shared.add_violation(kind, record.index, verdict.call_id, detail)
        if not verdict.accepted:
            return
        admit(state, result, client_id)
        if not result.final:
            return
        if not acted_on and result.id is not None:
            state.awaiting_turn.add(result.id)
        elif not state.blocking_outstanding() and scheduling != "SILENT":
            session.trigger("tool_result")
        session.wake()

