"""Model profiles: the wire rules of each Gemini Live generation, chosen by the setup's model.

The local server applies the rules of the generation the setup names (``models/`` stripped),
each the way the real API enforces it, and records every breach with
``server.add_violation``. The version is parsed as pipecat 1.14 parses it
(``GeminiLiveLLMService._gemini_version``): the first ``gemini(-word)*-MAJOR[.MINOR]`` in the
id, a missing minor being 0; "thinking" anywhere in the id marks a thinking model.

Profiles (``Profile.name``) and their rules, with the sources they rest on:

``"2.5"`` (version < 3.0, or no version in the id)
    ``clientContent`` is accepted at any time. A function declaration may say
    ``behavior: NON_BLOCKING``; undeclared functions are BLOCKING. No ``interactionStatus``.
    ``contextUpdate`` closes the socket (1007, ``context_update_unsupported``).
    Sources: pipecat ``_supports_non_blocking_tools`` (2.x supports NON_BLOCKING),
    ``_tools_default_to_non_blocking`` (only from 3.8).

``"3.1"`` (3.0 <= version < 3.8)
    ``clientContent`` only seeds the initial history: it is accepted only when the setup sets
    ``historyConfig.initialHistoryInClientContent``, only before the session's first model
    output (audio, model text, output transcription or a tool call sent on that connection),
    and never on a session that asked to resume from a handle. Anything else closes the
    socket 1007 "Request contains an invalid argument." (``client_content_refused``); text
    after that goes as ``realtimeInput.text``. Sources: livekit/agents PR 5251,
    google/adk-python PR 5076 (issue 5075), strands-agents harness-sdk PRs 2000 and 3424,
    yagudaev/voiceclaw PR 248 (1007 on a resumed 3.1 session that sent history as
    ``clientContent``), Google's 3.1 migration guide quoted there.
    A ``NON_BLOCKING`` declaration refuses the setup (1007, ``non_blocking_unsupported``):
    pipecat ``_supports_non_blocking_tools`` ("Before 3.8, Gemini 3.x models did not support
    NON_BLOCKING function declarations"). ``contextUpdate`` closes 1007
    (``context_update_unsupported``): issue 23 lists it for 3.8+ only, and livekit/agents
    issue 5496 and PR 5752 say 3.1 cannot change instructions mid-session. A conflicting
    signal: livekit/agents PR 7289 (the 3.8 release day) marks instructions and chat context
    mutable "throughout the session for 3.1 models"; no source shows the wire message. Right after ``setupComplete`` the server sends a
    ``serverContent`` holding only ``usageMetadata``, which is not a model reaction
    (livekit/agents PR 5251, PR 5238). Resuming from a handle whose state's system instruction
    is over 200 tokens (counted as ceil(len/4)) restores nothing: the session starts as a fresh
    one would, from its setup, and the connection record notes ``context_lost_on_resume``
    (google-gemini/cookbook issue 1197, item 11).

``"3.8"`` (version >= 3.8, no "thinking")
    Function calls run NON_BLOCKING unless declared ``BLOCKING`` (pipecat
    ``_tools_default_to_non_blocking``; livekit/agents issue 7302 quoting the 3.8 model page).
    ``clientContent`` is accepted at any time, as on 2.5: Google's 3.8 Live model page
    ("Migrating from Gemini 3.1 Flash Live", updated 2026-09) says ``send_client_content`` is
    supported throughout the session, with explicit roles; ``turn_complete`` true interrupts
    any generation under way, and without it the server waits for more before it answers
    (the service sends it only for a cut turn's note: session_store/cut_notes.py; results
    still go as realtime text, models.py). ``contextUpdate`` is accepted and
    replaces the state's system instruction and/or tools (google-genai 2.34
    ``AsyncSession.send_context_update``, ``LiveClientContextUpdate``).

``"3.8-thinking"`` (version >= 3.8 and "thinking" in the id)
    As 3.8, but ``clientContent`` keeps 3.1's rule (ASSUMED: the 3.8 page that lifts it names
    3.8 Live only, and no source says it of the thinking model), and a ``BLOCKING`` declaration (in the setup or a ``contextUpdate``) refuses it
    (1007, ``blocking_unsupported``): pipecat ``_supports_blocking_tools``, google-gemini
    gemini-skills PR 81 ("Only asynchronous non-blocking execution is supported"). Every
    ``serverContent`` sent while a model turn is under way or a call is open carries
    ``interactionStatus: IN_PROGRESS``; once the session is idle (no turn under way, no open
    call, no scripted step running) a ``serverContent`` holding only
    ``interactionStatus: IDLE`` follows. ``turnComplete`` does not make the session idle:
    tool calls and output may follow it (pipecat ``_expects_interaction_status``,
    gemini-skills PR 81, google-genai ``LiveServerContent.interaction_status``).
    A function response carrying ``scheduling`` closes the socket (1007,
    ``scheduling_unsupported``); an intermediate result (``willContinue: true``) is flagged
    ``intermediate_unsupported``: the model abandons the call after one (openclaw/openclaw
    PR 152413, probed against the live API on 2026-09-19).

Rules for function calls that hold on every profile (google-genai 2.34 ``FunctionResponse``):
``willContinue: true`` on a NON_BLOCKING call is an intermediate result and keeps the call
open; ``false`` closes it ("future responses will not be considered"). A NON_BLOCKING
response without ``willContinue`` is flagged (``will_continue_unset``: its meaning is
undocumented, pipecat always sets it) and taken as closing. ``willContinue`` "is only
applicable to NON_BLOCKING function calls, is ignored otherwise": on a BLOCKING call it is
flagged (``will_continue_on_blocking_call``) and the response is taken as final. A result
with ``scheduling: SILENT`` is taken in without a reply ("do not interrupt or trigger
generation").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

BLOCKING = "BLOCKING"
NON_BLOCKING = "NON_BLOCKING"

#: How the Live API closes on a message or setup it will not take.
INVALID_ARGUMENT = (1007, "Request contains an invalid argument.")

_VERSION = re.compile(r"gemini(?:-[a-z]+)*-(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class Profile:
    """The wire rules of one Gemini Live generation.

    - ``client_content_seeds_only``: ``clientContent`` only seeds the initial history
      (needs ``historyConfig.initialHistoryInClientContent``, before any model output, never
      on a resumed session).
    - ``default_mode``: the mode of a call whose function declares no ``behavior``.
    - ``accepts_blocking`` / ``accepts_non_blocking``: whether a declaration may say so.
    - ``context_update``: whether ``contextUpdate`` is taken in-session.
    - ``interaction_status``: ``serverContent`` carries ``interactionStatus``.
    - ``usage_after_setup``: a ``serverContent`` holding only ``usageMetadata`` follows
      ``setupComplete``.
    - ``resume_context_limit_tokens``: resuming from a state whose system instruction is
      longer than this restores nothing (None: resumption is faithful).
    - ``response_scheduling``: a function response may carry ``scheduling``.
    - ``intermediate_results``: a NON_BLOCKING call takes intermediate results
      (``willContinue: true``) and still acts on its final one.
    """

    name: str
    client_content_seeds_only: bool
    default_mode: str
    accepts_blocking: bool
    accepts_non_blocking: bool
    context_update: bool
    interaction_status: bool
    usage_after_setup: bool
    resume_context_limit_tokens: int | None = None
    response_scheduling: bool = True
    intermediate_results: bool = True


GEMINI_2_5 = Profile(
    name="2.5", client_content_seeds_only=False, default_mode=BLOCKING,
    accepts_blocking=True, accepts_non_blocking=True, context_update=False,
    interaction_status=False, usage_after_setup=False,
)
GEMINI_3_1 = Profile(
    name="3.1", client_content_seeds_only=True, default_mode=BLOCKING,
    accepts_blocking=True, accepts_non_blocking=False, context_update=False,
    interaction_status=False, usage_after_setup=True, resume_context_limit_tokens=200,
)
GEMINI_3_8 = Profile(
    name="3.8", client_content_seeds_only=False, default_mode=NON_BLOCKING,
    accepts_blocking=True, accepts_non_blocking=True, context_update=True,
    interaction_status=False, usage_after_setup=False,
)
# openclaw/openclaw PR 152413, probed against the live API: Extended Thinking closes the
# session on a function response with `scheduling` ("Function response scheduling is not
# supported for this model"), and after an interim `willContinue` response it abandons the
# call (its final result is never spoken).
GEMINI_3_8_THINKING = replace(
    GEMINI_3_8, name="3.8-thinking", client_content_seeds_only=True,
    accepts_blocking=False, interaction_status=True,
    response_scheduling=False, intermediate_results=False,
)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (GEMINI_2_5, GEMINI_3_1, GEMINI_3_8, GEMINI_3_8_THINKING)
}


def gemini_version(model: str) -> tuple[int, int] | None:
    """(major, minor) from a model id, as pipecat 1.14 reads it; None when absent."""
    match = _VERSION.search(model)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def profile_for(model: str) -> Profile:
    """The profile of the generation a setup's ``model`` names (a leading ``models/`` is
    dropped)."""
    model = model.removeprefix("models/")
    version = gemini_version(model)
    if version is None or version < (3, 0):
        return GEMINI_2_5
    if version < (3, 8):
        return GEMINI_3_1
    return GEMINI_3_8_THINKING if "thinking" in model else GEMINI_3_8


def resolve(profile: Profile | str | None) -> Profile | None:
    """A profile given by itself or by name (``LocalLiveServer(profile=...)``)."""
    if profile is None or isinstance(profile, Profile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r}; use one of {sorted(PROFILES)}") from None


def token_count(text: str | None) -> int:
    """The rough token count the resumption rule uses: four characters a token."""
    return math.ceil(len(text or "") / 4)


# --- refusals: pure decisions the server acts on by closing with INVALID_ARGUMENT ---------


@dataclass(frozen=True)
class Refusal:
    """Why the server closes the socket: the violation kind and its detail."""

    kind: str
    detail: str


def refuse_declarations(profile: Profile, behaviors: dict[str, str | None]) -> Refusal | None:
    """A declared ``behavior`` the generation does not take (setup or ``contextUpdate``)."""
    accepted = {BLOCKING: profile.accepts_blocking, NON_BLOCKING: profile.accepts_non_blocking}
    for name, behavior in behaviors.items():
        if behavior in accepted and not accepted[behavior]:
            only = NON_BLOCKING if behavior == BLOCKING else BLOCKING
            return Refusal(
                f"{behavior.lower()}_unsupported",
                f"{name} is declared {behavior}; Gemini {profile.name} runs calls {only} only",
            )
    return None


def refuse_client_content(
    profile: Profile, *, history_in_client_content: bool, model_output_sent: bool, resumed: bool
) -> Refusal | None:
    """Whether a ``clientContent`` message closes the socket on this generation."""
    if not profile.client_content_seeds_only:
        return None
    if not history_in_client_content:
        why = "the setup did not set historyConfig.initialHistoryInClientContent"
    elif resumed:
        why = "the session resumed from a handle"
    elif model_output_sent:
        why = "the model has already answered on this session"
    else:
        return None
    return Refusal(
        "client_content_refused",
        f"Gemini {profile.name} takes clientContent only to seed the initial history; {why}. "
        "Send text as realtimeInput.text",
    )


def refuse_scheduling(profile: Profile, responses: list[dict[str, Any]]) -> Refusal | None:
    """A function response carrying ``scheduling`` where the model refuses the field."""
    if profile.response_scheduling:
        return None
    for response in responses:
        inner = response.get("response")
        if response.get("scheduling") is not None or (
                isinstance(inner, dict) and inner.get("scheduling") is not None):
            return Refusal("scheduling_unsupported",
                           f"Function response scheduling is not supported for this model "
                           f"(Gemini {profile.name})")
    return None


def refuse_context_update(profile: Profile) -> Refusal | None:
    if profile.context_update:
        return None
    return Refusal(
        "context_update_unsupported",
        f"Gemini {profile.name} does not take contextUpdate; change settings by reconnecting",
    )


def history_in_client_content(setup: dict[str, Any]) -> bool:
    """Did a (normalised) setup opt in to seeding history through ``clientContent``?"""
    config = setup.get("history_config") or {}
    return isinstance(config, dict) and config.get("initial_history_in_client_content") is True
