"""Telling the live session what the caller heard of a turn they cut short (pure, no I/O).

The session that said a turn holds all of it, heard or not (lineage.holds_cut_turn keeps
later sessions from resuming it). While it lives, it is owed a note: the log's cut
(conversation.message_cut) puts a `CutNote` in the state, `due` turns it into a `TellCut`,
and the intents log it (`conversation.cut_telling`, then `cut_told` once the write
returned; or `conversation.cut_untold`). The note is owed only to that session: a takeover
or reconnect starts one that never held the whole turn, so a crash between the cut and the
note neither loses nor repeats it.

Per generation (models.ModelRules.cut_note; sources in docs/operations.md):
- 2.5: clientContent with turnComplete false, taken at any time; it adds to the context and
  starts no reply.
- 3.8: the same; Google's 3.8 Live model page ("Migrating from 3.1", Sept 2026) documents
  send_client_content through the whole session, with explicit roles, the server waiting
  for more without turn_complete.
- 3.1: not told. clientContent after the first model turn closes the session (1007), and
  realtimeInput.text is answered as the caller speaking; a fresh session seeded from the
  log would hold the heard part, but its handshake falls while the caller is talking.
- 3.8 thinking: not told. Mid-session clientContent is documented for 3.8 Live only; the
  one documented path, contextUpdate, replaces the system instruction (a note there is
  dropped by the next prompt change, and invalidates the prefix cache on every barge-in).
"""

from __future__ import annotations

from .models import ModelRules
from .state import CutNote, SessionState

UNTOLD_REASONS = {
    "3.1": "3.1 takes no clientContent after the first model turn (1007), and "
           "realtimeInput.text is answered as the caller speaking",
    "3.8-thinking": "mid-session clientContent is not documented for 3.8 thinking, and "
                    "contextUpdate would put the note in the system instruction",
}


def untold_reason(rules: ModelRules) -> str:
    """Why a session of this generation is not told (ModelRules.cut_note is None)."""
    return UNTOLD_REASONS.get(rules.family, f"Gemini {rules.family} takes no such note")


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
