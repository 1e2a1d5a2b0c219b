"""A preview ends between words: a key or a phone number the cut went through is not shown
in part, where no redaction pattern can recognise it."""

from __future__ import annotations


from session_store import events as ev
from session_store.audit.fmt import clip_strings, stored_length

from .conftest import running_viewer, viewer_client
from .test_big_calls import MB, write_call
from .test_web import href_of

KEY = "sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
PHONE = "+49 30 12345678"


def test_a_preview_does_not_end_inside_a_word_or_a_number():
    text = "a " * 995 + KEY + " call " + PHONE + " " + "u" * 100
    for limit in range(1991, len(text) - 100):  # every cut through the key and the number
        preview = clip_strings(text, limit)
        shown = preview[:preview.index("…")]
        assert stored_length(preview) == len(text), limit
        assert KEY in shown or "sk-" not in shown, (limit, shown[-50:])
        assert PHONE in shown or "+49" not in shown, (limit, shown[-50:])
    # a cut between words stays where it was; a blob with no word to end at is cut anyway
    assert clip_strings("abc " * 600, 2000) == "abc " * 500 + "… (400 more characters)"
    assert clip_strings("x" * 5000, 2000) == "x" * 2000 + "… (3,000 more characters)"


async def test_the_viewer_shows_no_part_of_a_key_or_number_the_preview_cut(migrated):
    def at_cut(c: str) -> str:  # the viewer's preview (2000) cuts the key, then the number
        return "a" * 1995 + " " + KEY + " " + c * MB

    def number_at_cut(c: str) -> str:
        return "a" * 1990 + " call " + PHONE + " " + c * MB

    await write_call(migrated, "big", [
        (0, ev.SessionOpened("gemini-live", ["lookup"], "w1", 1)), (0, ev.Connected(1)),
        (10, ev.ConversationMessage("user", at_cut("u"), 1)),
        (20, ev.ToolCallRequested("c1", "lookup", {"note": at_cut("n"), "q": "x"}, 1)),
        (30, ev.ToolCallStarted("c1", 1, "k1", 1)),
        (40, ev.ToolCallCompleted("c1", {"text": number_at_cut("r")})),
        (50, ev.AnomalyRecorded("x", {"error": at_cut("d")}, 1))])
    with running_viewer(migrated) as base:
        async with viewer_client(base, timeout=60) as http:
            for path in ("api/timeline", "calls", "api/state"):
                for params in ({}, {"redact": "1"}):
                    r = await http.get(href_of(path, "big"), params=params)
                    assert r.status_code == 200, r.text
                    assert "sk-" not in r.text, (path, params)
                    if params:
                        assert "+49" not in r.text, (path, params)
