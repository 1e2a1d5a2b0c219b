"""The testing kit: its example (examples/testing_kit/test_my_bot.py) runs with the suite,
and its API stays what docs/testing-kit.md promises.

pytest collects only under tests/ (pyproject's testpaths); importing the example's tests
here keeps the copy users start from working.
"""

from examples.testing_kit.test_my_bot import (  # noqa: F401 - collected by pytest
    test_an_answer_sent_twice_is_caught,
    test_the_bot_answers_the_tool_call_once,
    test_the_record_shows_what_the_bot_sent,
)


def test_the_kit_api_is_what_docs_testing_kit_md_promises():
    # The kit's stable API: removing or renaming one of these breaks users' tests.
    import service.local_live as kit

    promised = {
        "LocalLiveServer", "ScriptSource", "http_options", "Script", "Call", "Audio",
        "OutputTranscript", "InputTranscript", "TurnComplete", "Interrupted", "ToolCall",
        "CancelToolCalls", "WaitToolResponse", "WaitIntermediate", "WaitFor", "WaitSignal",
        "ResumptionUpdate", "GoAway", "Usage", "InteractionStatus", "Close", "Drop", "Sleep",
        "Raw", "Dynamic", "Step", "DEFAULT_REPLY", "DROP_SETUP", "HANDLE_REFUSED",
        "PROFILES", "Profile", "profile_for", "Connection", "ClientMessage", "SentMessage",
        "ToolResult", "ConversationEntry", "ModelState", "HandleRecord",
    }
    assert promised <= set(kit.__all__)
    assert all(hasattr(kit, name) for name in kit.__all__)
