"""Telling the live session what the caller heard of a turn they cut short (pure, no I/O).

The session that said a turn holds all of it, heard or not (lineage.holds_cut_turn keeps
later sessions from resuming it). While it lives, it is owed a note: the log's cut
(conversation.message_cut) puts a `CutNote` in the state, `due` turns it into a `TellCut`,
and the intents log it (`conversation.cut_telling`, then `cut_told` once the write
returned). The note is owed only to that session: a takeover or reconnect starts one that
never held the whole turn, so a crash between the cut and the note neither loses nor
repeats it.

Per generation (models.ModelRules.cut_note; sources in docs/generations.md):
- 2.5: clientContent with turnComplete false, taken at any time; it adds to the context and
  starts no reply.
- 3.8: the same; Google's 3.8 Live model page ("Migrating from 3.1", Sept 2026) documents
  send_client_content through the whole session, with explicit roles, the server waiting
  for more without turn_complete.
- 3.1 and 3.8 thinking: "reseed". No message tells them: on 3.1 clientContent after the
  first model turn closes the session (1007) and realtimeInput.text is answered as the
  caller speaking; on 3.8 thinking mid-session clientContent is undocumented and
  contextUpdate carries only the system instruction. So the session is replaced
  (`ReconnectRequested(CUT_TURN)`, at the next safe point: the bot silent) by a fresh one
  seeded from the log, which holds the heard part. The caller is usually talking then: the
  service sends the new session their audio from before the cut and what they said during
  the handshake (service/caller_audio.py). Logs written before 2026-12-07 record
  `conversation.cut_untold` here instead (not told at all).
"""

from __future__ import annotations

from .state import CutNote, SessionState

#: The reconnect that replaces a session that said a cut turn, where no note can tell it.
CUT_TURN = "cut_turn"


def replacing_for_cut(state: SessionState) -> bool:
    """Is the live session to be replaced because it said a cut turn ("reseed" under way)?"""
    return any(n.via == "reseed" and n.generation == state.generation
               for n in state.cut_notes)


def owed(state: SessionState) -> list[CutNote]:
    """The notes the live session is owed and nothing is under way for, in cut order."""
    if not state.connected:
        return []
    return [n for n in state.cut_notes if n.generation == state.generation and n.via is None]


def note_text(heard: str) -> str:
    """The note, as a user turn of clientContent: what the caller heard, and that the rest
    of the model's last answer did not reach them (`heard` ends with the cut mark)."""
    words = heard.rstrip(" —").strip()
    if not words:
        return ("[The caller talked over your last answer and heard none of it. "
                "Do not assume they know anything it said.]")
    return (f"[The caller talked over your last answer and heard only: \"{words}\". "
            "They did not hear the rest; do not assume they know it.]")
