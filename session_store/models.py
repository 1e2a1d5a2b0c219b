"""What each Gemini Live model generation accepts on the wire, as a pure function of the model id.

The service's decisions that differ by generation (how a result the session never asked for
goes in, which calls block, what "idle" means, whether a prompt change needs a new session)
read these rules from the model the log records, so `replay` decides them as the worker did.
The version is parsed exactly as pipecat 1.14 parses it (`GeminiLiveLLMService._gemini_version`,
pinned against it by tests/service/test_pipecat_contract.py). Sources per rule: README,
"Model generations".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_VERSION = re.compile(r"gemini(?:-[a-z]+)*-(\d+)(?:\.(\d+))?")

Family = Literal["2.5", "3.1", "3.8", "3.8-thinking"]


@dataclass(frozen=True)
class ModelRules:
    family: Family
    #: `clientContent` accepted after the first model turn (2.x). From 3.1 on it only seeds
    #: the initial history of a fresh session; other text goes as `realtimeInput.text`.
    client_content_mid_session: bool
    #: NON_BLOCKING function declarations exist (2.x, and 3.8 on).
    non_blocking_declarations: bool
    #: Calls run NON_BLOCKING unless declared BLOCKING (3.8 on).
    calls_default_non_blocking: bool
    #: BLOCKING declarations accepted (not on thinking models).
    blocking_declarations: bool
    #: The server reports `interaction_status`; idle is IDLE, not turnComplete.
    interaction_status: bool
    #: `contextUpdate` changes the system instruction and tools in-session.
    context_update: bool
    #: A NON_BLOCKING call's response may carry `scheduling`. 3.8 thinking closes the socket
    #: (1007 "Function response scheduling is not supported for this model").
    response_scheduling: bool
    #: A NON_BLOCKING call takes intermediate results (`will_continue` true). 3.8 thinking
    #: accepts one, then abandons the call: its final result is never spoken.
    intermediate_results: bool
    #: Resumption was reported to stop restoring context once the system instruction is
    #: longer than this many tokens (None: no such report).
    resumption_prompt_token_limit: int | None
    #: The user's last words may be transcribed after the model's answer to them (3.x:
    #: LiveKit agents-js PR 2162, agents PR 6914).
    late_input_transcription: bool = False
    #: How the live session that said a turn the caller cut short is told what they heard:
    #: "content" (clientContent with turnComplete false: a note that starts no reply), or
    #: None where no message does that (session_store/cut_notes.py: why, per generation).
    cut_note: Literal["content"] | None = None
    #: A fresh session seeded after a reconnect is asked to answer its seed (pipecat's rule:
    #: 2.5 recalls no seeded history from the caller's audio, so it recaps at once; 3.x
    #: answers the caller's next words from the history).
    seed_recap_after_reconnect: bool = False
    #: A seed's last turn must be a user turn (2.5's clientContent requires it).
    seed_ends_with_user_turn: bool = False
    #: A seed the model is to answer also goes with a `realtimeInput.text` (3.x runs no
    #: inference on turnComplete without a realtime input).
    seed_answer_by_text: bool = False


RULES: dict[str, ModelRules] = {
    "2.5": ModelRules("2.5", client_content_mid_session=True, non_blocking_declarations=True,
                      calls_default_non_blocking=False, blocking_declarations=True,
                      interaction_status=False, context_update=False,
                      response_scheduling=True, intermediate_results=True,
                      resumption_prompt_token_limit=None, cut_note="content",
                      seed_recap_after_reconnect=True, seed_ends_with_user_turn=True),
    "3.1": ModelRules("3.1", client_content_mid_session=False, non_blocking_declarations=False,
                      calls_default_non_blocking=False, blocking_declarations=True,
                      interaction_status=False, context_update=False,
                      response_scheduling=False, intermediate_results=False,
                      resumption_prompt_token_limit=200, late_input_transcription=True,
                      seed_answer_by_text=True),
    "3.8": ModelRules("3.8", client_content_mid_session=False, non_blocking_declarations=True,
                      calls_default_non_blocking=True, blocking_declarations=True,
                      interaction_status=False, context_update=True,
                      response_scheduling=True, intermediate_results=True,
                      resumption_prompt_token_limit=None, late_input_transcription=True,
                      cut_note="content", seed_answer_by_text=True),
    "3.8-thinking": ModelRules("3.8-thinking", client_content_mid_session=False,
                               non_blocking_declarations=True, calls_default_non_blocking=True,
                               blocking_declarations=False, interaction_status=True,
                               context_update=True, response_scheduling=False,
                               intermediate_results=False, resumption_prompt_token_limit=None,
                               late_input_transcription=True, seed_answer_by_text=True),
}


def model_version(model: str) -> tuple[int, int] | None:
    """Major/minor from a model id (`models/gemini-3.8-live` -> (3, 8)), or None."""
    match = _VERSION.search(model or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def family(model: str) -> Family:
    version = model_version(model)
    if version is None or version < (3, 0):
        return "2.5"  # (pipecat treats an id without a version as pre-3.x too)
    if version < (3, 8):
        return "3.1"
    return "3.8-thinking" if "thinking" in (model or "") else "3.8"


def rules_for(model: str) -> ModelRules:
    return RULES[family(model)]


CallMode = Literal["blocking", "non_blocking"]


def call_mode(rules: ModelRules, declared: str | None) -> CallMode:
    """How the server runs a call whose function was declared with `declared` behaviour
    (what the setup said: "BLOCKING", "NON_BLOCKING", or None for no behaviour)."""
    if declared == "NON_BLOCKING" and rules.non_blocking_declarations:
        return "non_blocking"
    if rules.calls_default_non_blocking and (declared != "BLOCKING"
                                             or not rules.blocking_declarations):
        return "non_blocking"
    return "blocking"


def prompt_tokens(text: str) -> int:
    """A rough token count (4 characters a token), enough for a documented threshold."""
    return -(-len(text or "") // 4)
