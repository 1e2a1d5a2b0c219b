"""The private pipecat surface DurableGeminiLiveLLMService depends on, pinned.

service/gemini_live.py overrides private hooks of pipecat's GeminiLiveLLMService (and its parts
in service/ call some of them) and
reads its private attributes. None of that is a public API: an upgrade may rename, re-type or
re-wire any of it without notice, and the subclass would then fail quietly (a hook that is
never called again is not an error). This file fails loudly instead. When it fails after an
upgrade: re-read the new llm.py, re-check every point of /work/shared/FACTS.md and
tests/service/test_scenarios.py on both services, then update the pins here.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import ssl

import pytest
from pipecat.services.google.gemini_live import llm as gemini_live_module
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from service.gemini_live import DurableGeminiLiveLLMService

PIPECAT_VERSION = "1.14.0"

_G = "pipecat.services.google.gemini_live.llm.GeminiLiveLLMService"
_LLM = "pipecat.services.llm_service.LLMService"

# name -> (class that defines it, signature, is a coroutine function)
METHODS = {
    # overridden
    "_connect": (_G, "(self, session_resumption_handle: str | None = None)", True),
    "_connection_task_handler": (_G, "(self, config: google.genai.types.LiveConnectConfig)", True),
    "_handle_session_ready": (_G, "(self, session: google.genai.live.AsyncSession)", True),
    "_reconnect": (_G, "(self)", True),
    "_create_initial_response": (_G, "(self, for_reconnect: bool = False)", True),
    "_handle_server_message": (
        _G, "(self, message: google.genai.types.LiveServerMessage)", True),
    "_handle_msg_tool_call": (_G, "(self, message: google.genai.types.LiveServerMessage)", True),
    "_handle_function_call_result": (
        _G, "(self, frame: pipecat.frames.frames.FunctionCallResultFrame)", True),
    "_tool_result": (
        _G, "(self, tool_call_id: str, tool_name: str, tool_result_message: dict[str, "
            "typing.Any], *, is_final: bool = True, spoken: bool = True)", True),
    "_process_completed_function_calls": (_G, "(self, send_new_results: bool)", True),
    "_set_bot_is_responding": (_G, "(self, responding: bool)", True),
    "_update_settings": (
        _G, "(self, delta: pipecat.services.settings.LLMSettings) -> dict[str, typing.Any]", True),
    "setup": (_G, "(self, setup: pipecat.processors.frame_processor.FrameProcessorSetup)", True),
    "stop": (_G, "(self, frame: pipecat.frames.frames.EndFrame)", True),
    "cleanup": (_G, "(self)", True),
    "process_frame": (
        _G, "(self, frame: pipecat.frames.frames.Frame, "
            "direction: pipecat.processors.frame_processor.FrameDirection)", True),
    "_handle_connection_error": (_G, "(self, error: Exception) -> bool", True),
    "_tag_tool_behaviors": (_G, "(self, tools: list) -> None", False),
    "_handle_interruptions": (_LLM, "(self, _: 'InterruptionFrame')", True),
    "_run_function_call": (_LLM, "(self, runner_item: 'FunctionCallRunnerItem')", True),
    "_send_user_audio": (_G, "(self, frame)", True),
    # called
    "_disconnect": (_G, "(self)", True),
    "_cancel_function_calls_by_tool_call_id": (_LLM, "(self, tool_call_id: 'str')", True),
    "run_function_calls": (
        _LLM, "(self, function_calls: 'Sequence[FunctionCallFromLLM]')", True),
    "push_frame": (
        _G, "(self, frame: pipecat.frames.frames.Frame, direction: "
            "pipecat.processors.frame_processor.FrameDirection = <FrameDirection.DOWNSTREAM: 1>)",
        True),
}

# Instance attributes the subclass reads or writes, and what a fresh service holds.
ATTRIBUTES = {
    "_session": None,
    "_connection_task": None,
    "_disconnecting": False,
    "_system_instruction_from_init": "Be brief.",
    "_base_system_instruction": "Be brief.",  # what pipecat recomposes the prompt from
    "_session_resumption_handle": None,
    "_run_llm_when_session_ready": False,
    "_ready_for_realtime_input": False,
    "_bot_is_responding": False,
    "_context": None,
    "_tools_from_init": None,
    "_inference_on_context_initialization": True,
    "_consecutive_failures": 0,
    "_audio_input_paused": False,
    "_vad_disabled": False,  # (server-side voice detection: the caller's audio streams)
}

# Class constants of pipecat's the subclass sets, and pipecat's value of each.
CONSTANTS = {"_DEFAULT_THINKING_LEVEL": "LOW"}

# Call edges inside pipecat that the subclass relies on: (method, what its body must mention).
WIRING = [
    ("push_frame", "_handle_function_call_result"),  # results reach our override
    ("_handle_function_call_result", "_tool_result"),
    ("_connection_task_handler", "_handle_session_ready"),
    ("_connection_task_handler", "_handle_server_message"),
    ("_connection_task_handler", "_handle_connection_error"),
    ("_connection_task_handler", "_reconnect"),  # receive errors go through our _reconnect
    ("_handle_server_message", "_handle_msg_tool_call"),
    ("_handle_session_ready", "_create_initial_response"),
    ("_handle_session_ready", "_session_resumption_handle"),
    ("_handle_context", "_process_completed_function_calls"),
    ("_reconnect", "_disconnect"),
    ("_reconnect", "_connect"),
    ("_connect", "_system_instruction_from_init"),  # the new prompt travels through it
    # The prompt pipecat keeps in `_settings` is rebuilt from this base (a takeover sets it).
    ("_compose_system_instruction", "_base_system_instruction"),
    ("_connect", "_connection_task_handler"),
    ("setup", "_connect"),
    # Declarations are tagged where the model takes NON_BLOCKING ones (we read them back).
    ("_connect", "_tag_tool_behaviors"),
    ("_tag_tool_behaviors", "_function_is_async"),
    # A call pipecat stops without a result (its timeout) reaches our push_frame as a
    # FunctionCallCancelFrame; interruptions cancel calls only through _handle_interruptions.
    ("_timeout_function_call", "_cancel_function_call_tasks"),
    ("_cancel_function_call_tasks", "_broadcast_function_call_cancelled"),
    ("_broadcast_function_call_cancelled", "FunctionCallCancelFrame"),
    ("_cancel_function_call", "_cancel_function_call_tasks"),
    # Every tool runs through _run_function_call, queued (sequential) or not.
    ("_run_parallel_function_calls", "_run_function_call"),
    ("_sequential_runner_handler", "_run_function_call"),
    # The caller's audio reaches Gemini only through _send_user_audio (our hold wraps it).
    ("process_frame", "_send_user_audio"),
]


def test_pipecat_version_is_the_pinned_one():
    assert importlib.metadata.version("pipecat-ai") == PIPECAT_VERSION, (
        "pipecat changed: re-check every private hook (see this file's docstring)")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_private_method_signature(name):
    owner, signature, is_async = METHODS[name]
    defined_in = next(f"{c.__module__}.{c.__qualname__}" for c in GeminiLiveLLMService.__mro__
                      if name in c.__dict__)
    method = getattr(GeminiLiveLLMService, name)
    assert defined_in == owner, f"{name} moved from {owner} to {defined_in}"
    assert str(inspect.signature(method)) == signature, f"{name} changed its signature"
    assert inspect.iscoroutinefunction(method) == is_async


# Our classes: the service and its mixins, i.e. everything in its MRO before pipecat's class.
_OURS = DurableGeminiLiveLLMService.__mro__[
    :DurableGeminiLiveLLMService.__mro__.index(GeminiLiveLLMService)]


def _our_override(name):
    return next((c.__dict__[name] for c in _OURS if name in c.__dict__), None)


def test_overrides_are_the_pinned_ones():
    """Every pipecat method our classes define is pinned above (no unpinned override)."""
    pipecat_names = {n for c in GeminiLiveLLMService.__mro__ for n in c.__dict__}
    ours = {n for c in _OURS for n in c.__dict__
            if n in pipecat_names and not n.startswith("__") and n != "_abc_impl"
            and n not in CONSTANTS}
    assert ours <= set(METHODS), f"overrides not pinned: {sorted(ours - set(METHODS))}"


@pytest.mark.parametrize("name", sorted(n for n in METHODS if _our_override(n) is not None))
def test_override_accepts_what_pipecat_passes(name):
    """Each override takes the same parameters (names, kinds, defaults) as pipecat's."""
    ours = inspect.signature(_our_override(name))
    theirs = inspect.signature(getattr(GeminiLiveLLMService, name))
    shape = [(p.name, p.kind, p.default) for p in theirs.parameters.values()]
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == shape
    assert inspect.iscoroutinefunction(_our_override(name)) == METHODS[name][2]


def test_private_attributes_exist_with_their_initial_values():
    llm = GeminiLiveLLMService(api_key="x", settings=GeminiLiveLLMService.Settings(
        model="models/gemini-2.5-flash-native-audio-preview", system_instruction="Be brief."))
    for name, initial in ATTRIBUTES.items():
        assert hasattr(llm, name), f"GeminiLiveLLMService no longer has {name}"
        assert getattr(llm, name) == initial, f"{name} starts as {getattr(llm, name)!r}"
    assert llm._settings.system_instruction == "Be brief."
    assert isinstance(inspect.getattr_static(GeminiLiveLLMService, "_is_gemini_3"), property)
    assert llm._is_gemini_3 is False
    assert GeminiLiveLLMService(api_key="x")._is_gemini_3 is True  # the 3.8 default model
    assert gemini_live_module.MAX_CONSECUTIVE_FAILURES == 3


@pytest.mark.parametrize("model", [
    None, "models/gemini-2.5-flash-native-audio-preview", "gemini-live-2.5-flash-preview",
    "gemini-2.0-flash-live-001", "gemini-3.1-flash-live-preview", "gemini-3.0-live",
    "gemini-3.8-live", "gemini-3.8-live-extended-thinking", "models/gemini-4.2-live-thinking",
    "gemini-2.5-flash-exp-native-audio-thinking-dialog", "some-live-model"])
def test_our_generation_rules_agree_with_pipecats_branches(model):
    """session_store.models decides per generation without pipecat; where pipecat branches
    on the same facts, both must say the same for every model id."""
    from session_store.models import model_version, rules_for

    llm = GeminiLiveLLMService(api_key="x", settings=GeminiLiveLLMService.Settings(
        model=model) if model else None)
    rules = rules_for(str(llm._settings.model))
    assert model_version(str(llm._settings.model)) == llm._gemini_version
    # (pipecat's "3.x" means major 3; ours groups 4.x with the newest rules it knows)
    assert (rules.family != "2.5") == llm._is_gemini_3 or llm._gemini_version >= (4, 0)
    assert rules.non_blocking_declarations == llm._supports_non_blocking_tools
    assert rules.calls_default_non_blocking == llm._tools_default_to_non_blocking
    assert rules.blocking_declarations == llm._supports_blocking_tools
    assert rules.interaction_status == llm._expects_interaction_status


def test_a_thinking_model_setup_serializes_without_warnings():
    """pipecat defaults a thinking model's level through model_copy (no validation): ours
    gives the enum, so google-genai's serializer does not warn on every connect."""
    import warnings

    for name, value in CONSTANTS.items():
        assert GeminiLiveLLMService.__dict__[name] == value
        assert DurableGeminiLiveLLMService.__dict__[name] == value  # (a str enum)
    assert "_DEFAULT_THINKING_LEVEL" in inspect.getsource(
        GeminiLiveLLMService._resolved_thinking_config)
    settings = GeminiLiveLLMService.Settings(model="gemini-3.8-live-extended-thinking")
    for cls, warns in ((GeminiLiveLLMService, True), (DurableGeminiLiveLLMService, False)):
        llm = GeminiLiveLLMService(api_key="x", settings=settings)
        llm._DEFAULT_THINKING_LEVEL = cls.__dict__["_DEFAULT_THINKING_LEVEL"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dumped = llm._resolved_thinking_config().model_dump(mode="json")
        assert dumped["thinking_level"] == "LOW"
        assert bool(caught) is warns, [str(w.message) for w in caught]


@pytest.mark.parametrize("method,mentions", WIRING)
def test_pipecat_wiring_we_rely_on(method, mentions):
    source = inspect.getsource(getattr(GeminiLiveLLMService, method))
    assert re.search(rf"\b{re.escape(mentions)}\b", source), (
        f"GeminiLiveLLMService.{method} no longer uses {mentions}")


def test_what_upstream_still_ignores():
    """We handle goAway and toolCallCancellation ourselves, before upstream's dispatcher; if
    upstream starts handling them, both would act. _handle_msg_resumption_update is called
    without await: it must stay synchronous (we read the handle in _handle_server_message)."""
    source = inspect.getsource(GeminiLiveLLMService._handle_server_message)
    assert "go_away" not in source
    assert "tool_call_cancellation" not in source
    assert not inspect.iscoroutinefunction(GeminiLiveLLMService._handle_msg_resumption_update)
    # _update_settings only warns: the reconnect for a new prompt is ours.
    assert "_reconnect" not in inspect.getsource(GeminiLiveLLMService._update_settings)


# --------------------------------------------------------------------------- google-genai
# service/wire.py wraps each live session's private receive path, and the service sets the
# websocket frame limit through HttpOptions.async_client_args. Pinned like pipecat's hooks:
# when this fails after an upgrade, re-read google/genai/live.py (AsyncSession.receive,
# _receive) and re-run tests/faults/test_hostile_wire.py.
GENAI_VERSION = "2.34.0"


def test_google_genai_version_is_the_pinned_one():
    assert importlib.metadata.version("google-genai") == GENAI_VERSION, (
        "google-genai changed: re-check the receive path service/wire.py wraps")


def test_the_session_receive_path_we_wrap():
    from google.genai.live import AsyncSession

    # receive() pulls every message through the instance's _receive (which we replace) ...
    assert re.search(r"self\._receive\(\)", inspect.getsource(AsyncSession.receive))
    assert str(inspect.signature(AsyncSession._receive)) == (
        "(self) -> google.genai.types.LiveServerMessage")
    # ... which reads one frame from the instance's _ws (which we wrap) and parses it.
    source = inspect.getsource(AsyncSession._receive)
    assert "self._ws.recv(" in source and "json.loads" in source
    assert "self._ws = websocket" in inspect.getsource(AsyncSession.__init__)


def test_what_the_sdk_does_with_frames_we_guard_against():
    """The facts wire.py is built on: invalid JSON raises; a message with no field the SDK
    knows raises too; fields it does not know next to known ones are dropped silently."""
    from google.genai import _live_converters, errors, types
    from google.genai.live import AsyncSession

    from service.wire import KNOWN_FIELDS

    def parse(frame: dict):
        converted = _live_converters._LiveServerMessage_from_mldev(frame)
        if not converted and frame:
            errors.APIError.raise_error(frame.get("code"), frame, None)
        return types.LiveServerMessage._from_response(response=converted, kwargs={})

    with pytest.raises(Exception):
        parse({"brandNewMessage": {}})
    assert parse({"usageMetadata": {}, "extraField": 1}).usage_metadata is not None
    assert "Failed to parse response" in inspect.getsource(AsyncSession._receive)
    assert {"toolCall", "serverContent", "sessionResumptionUpdate", "goAway"} <= KNOWN_FIELDS


def test_async_client_args_reach_the_websocket_connect(tmp_path):
    """DurableGeminiLiveLLMService raises the frame limit through http_options."""
    from google.genai import Client, types

    from service.wire import with_frame_limit

    for options in (None, {"headers": {"a": "b"}}, types.HttpOptions(headers={"a": "b"})):
        client = Client(api_key="x", http_options=with_frame_limit(options, 12345))
        assert client._api_client._websocket_ssl_ctx["max_size"] == 12345
    from google.genai.live import AsyncLive
    assert "**self._api_client._websocket_ssl_ctx" in inspect.getsource(AsyncLive.connect)
    from service.gemini_live import MAX_FRAME_BYTES
    from session_store.storage.sqlite.dialect import sqlite_store
    unopened = sqlite_store(f"sqlite+aiosqlite:///{tmp_path}/unused.db")  # no I/O yet
    llm = DurableGeminiLiveLLMService(api_key="x", store=unopened, call_id="c")
    assert llm._client._api_client._websocket_ssl_ctx["max_size"] == MAX_FRAME_BYTES


def test_every_client_transport_takes_the_shared_tls_context(tmp_path):
    """google-genai parses the CA bundle into a context per transport of every Client unless
    it is handed one (`_ensure_*_ssl_ctx`, private): the service hands every transport the
    process-wide one (service/client_options.py), so a call start parses nothing."""
    from google.genai import Client, types
    from google.genai._api_client import BaseApiClient

    from service.client_options import shared_tls_context, with_shared_tls
    from session_store.storage.sqlite.dialect import sqlite_store

    for hook in ("_ensure_httpx_ssl_ctx", "_ensure_aiohttp_ssl_ctx",
                 "_ensure_websocket_ssl_ctx"):
        assert "ssl.create_default_context(" in inspect.getsource(getattr(BaseApiClient, hook))

    def contexts(api) -> list:
        found = [api._websocket_ssl_ctx["ssl"], api._async_httpx_client_args["verify"]]
        if hasattr(api, "_async_client_session_request_args"):  # aiohttp installed
            found.append(api._async_client_session_request_args["ssl"])
        return found

    unopened = sqlite_store(f"sqlite+aiosqlite:///{tmp_path}/unused.db")  # no I/O yet
    shared = shared_tls_context()
    for n in range(2):
        llm = DurableGeminiLiveLLMService(api_key="x", store=unopened, call_id=f"c{n}")
        assert all(ctx is shared for ctx in contexts(llm._client._api_client))
    # A caller's own context (the local server's certificate) reaches every transport too.
    own = ssl.create_default_context()
    for options in ({"async_client_args": {"ssl": own}},
                    types.HttpOptions(async_client_args={"ssl": own},
                                      client_args={"timeout": 5})):
        api = Client(api_key="x", http_options=with_shared_tls(options))._api_client
        assert all(ctx is own for ctx in contexts(api))
        assert api._httpx_client._transport._pool._ssl_context is own


def test_a_restored_prompt_is_composed_once_with_pipecats_addons():
    """A takeover restores the prompt the log holds, as pipecat composed it (base + addons)
    (gemini_live.base_prompt): composed again from the base it derives, the addons appear
    once, and a plain prompt (no addons) is its own base."""
    from service.gemini_live import base_prompt

    llm = GeminiLiveLLMService(api_key="x", settings=GeminiLiveLLMService.Settings(
        model="models/gemini-2.5-flash-native-audio-preview", system_instruction="Be brief."))
    llm.append_system_instruction("Render lists as cards.")
    composed = llm._settings.system_instruction
    assert composed.startswith("Be brief.") and composed.endswith("Render lists as cards.")
    logged = "Speak French." + composed[len("Be brief."):]  # what the log holds after a change
    llm._base_system_instruction = base_prompt(logged, composed, llm._base_system_instruction)
    assert llm._base_system_instruction == "Speak French."
    llm._compose_system_instruction()
    assert llm._settings.system_instruction == logged
    assert base_prompt("Speak French.", "Be brief.", "Be brief.") == "Speak French."


def test_the_constructor_spells_out_every_parameter_of_pipecats():
    """Every parameter of pipecat's constructor is one of ours too, with its default, so IDEs
    and type checkers see it (a `**kwargs` pass-through hid them); the rest go on to the
    base services through `**kwargs`."""
    theirs = inspect.signature(GeminiLiveLLMService.__init__).parameters
    ours = inspect.signature(DurableGeminiLiveLLMService.__init__).parameters
    for name, param in theirs.items():
        if name == "self" or param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        assert name in ours, f"pipecat's {name!r} is not spelled out"
        assert ours[name].default == param.default, name
        assert ours[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in ours.values())


_FIRST_CALL_AFTER_WARM_UP = """
import ssl, sys
from service.gemini_live import DurableGeminiLiveLLMService
from session_store.storage.sqlite.dialect import sqlite_store
store = sqlite_store(sys.argv[1])  # (the worker's store is open before its calls)
DurableGeminiLiveLLMService.warm_up()
before = set(sys.modules)
parsed = []
real = ssl.create_default_context
ssl.create_default_context = lambda *a, **k: parsed.append(a or k) or real(*a, **k)
DurableGeminiLiveLLMService(api_key="x", store=store, call_id="c")
print(sorted(set(sys.modules) - before), parsed)
"""


def test_after_warm_up_a_first_call_imports_and_parses_nothing(tmp_path):
    """A fresh worker's first call builds its google-genai client on the event loop: after
    `warm_up()` (the phone bot's lifespan runs it) that imports no module and parses no CA
    bundle (without it: ~65 ms of blocked loop, a silence in the calls already there)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL_AFTER_WARM_UP,
         f"sqlite+aiosqlite:///{tmp_path}/unused.db"],
        capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[] []", result.stdout
