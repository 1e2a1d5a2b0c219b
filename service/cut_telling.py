"""Telling the live session what the caller heard of a turn they cut short: the send of a
`conversation.cut_telling` intent (what is owed, and how, is decided in
session_store/cut_notes.py and `due`). Performed by the EffectRunner after the intent is
committed, confirmed by `conversation.cut_told`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from google.genai.types import Content, Part
from loguru import logger

from session_store import events as ev
from session_store.cut_notes import note_text
from session_store.state import SessionState

from .log_writer import LogWriter, When


async def tell_cut(intent: ev.CutTelling, session, state: SessionState, log: LogWriter, *,
                   sending: Callable[[int], None],
                   failed: Callable[[Exception, str, int], Awaitable[None]]) -> bool:
    """Send the note as clientContent with turnComplete false: it joins the context and starts
    no reply (the caller is talking; Gemini answers them). Only on the session it is owed to:
    a session that replaced it never held the whole turn. True if it went out."""
    note = next((n for n in state.cut_notes if n.cut == intent.cut), None)
    if session is None or note is None or intent.generation != state.generation:
        return False
    try:
        sending(intent.generation)  # a handle may cross it on the wire, as content
        await session.send_client_content(
            turns=[Content(role="user", parts=[Part(text=note_text(note.heard))])],
            turn_complete=False)
    except Exception as exc:  # noqa: BLE001 - left under way: the reconnect ends what is owed
        logger.warning(f"telling generation {intent.generation} what the caller heard "
                       f"failed: {exc}")
        await failed(exc, "cut_note", intent.generation)
        return False
    await log.log(ev.CutTold(intent.generation, intent.cut, intent.via), when=When.LAZY)
    return True
