"""`export --redact` on the corpus of tests/tools/redaction_corpus.py: each item written into a
call in one of five places (a tool argument, a result, JSON text inside a result, a failure
message, a transcript shown with `transcripts = false`), exported line by line as the CLI does.
At least 95% of the items must be masked whole and at most 2% of the look-alikes touched; a
finding never takes the rest of its sentence with it."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from session_store import events as ev
from session_store.audit import Redactor
from session_store.audit.export import export_line
from session_store.audit.redaction import RedactionConfig

from .helpers import chain
from .redaction_corpus import LOOK_ALIKES, PERSONAL, Item, table

PLACES = ("arg", "result", "json_result", "failure", "transcript")


def _call(n: int, text: str, place: str, language: str | None = None,
          caller: str | None = None) -> list[ev.Event]:
    evs: list[ev.Event] = [ev.SessionOpened("gemini-live", ["lookup"], "w1", 1,
                                            settings={"language": language} if language else {}),
                           ev.Connected(1)]
    if caller:  # the caller's own number, as a tool got it before
        evs += [ev.ToolCallRequested("c0", "lookup", {"caller": caller}, 1)]
    if place == "arg":
        evs.append(ev.ToolCallRequested("c1", "lookup", {"note": text, "n": n}, 1))
    elif place in ("result", "json_result"):
        result = {"summary": text} if place == "result" else {"raw": json.dumps({"memo": text})}
        evs += [ev.ToolCallRequested("c1", "lookup", {"n": n}, 1),
                ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallCompleted("c1", result)]
    elif place == "failure":
        evs += [ev.ToolCallRequested("c1", "lookup", {"n": n}, 1),
                ev.ToolCallStarted("c1", 1, "k", 1), ev.ToolCallFailed("c1", text)]
    else:
        evs.append(ev.ConversationMessage("user", text, 1))
    return evs


def _exported(redactor: Redactor, call: str, evs: list[ev.Event]) -> str:
    """The call's last line's data as exported (the earlier lines only teach the call)."""
    recs = chain(call, [(i, e) for i, e in enumerate(evs)])
    lines = [export_line(r, redactor) for r in recs]
    return json.dumps(lines[-1]["data"], ensure_ascii=False)


def _redactor() -> Redactor:
    return Redactor(RedactionConfig(enabled=True, transcripts=False))


def measure():
    """(per kind: (items, masked)), (look-alikes masked, look-alikes), misses, masked ones."""
    redactor = _redactor()
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses: list[tuple[Item, str]] = []
    for n, item in enumerate(PERSONAL):
        out = _exported(redactor, f"pii-{n}",
                        _call(n, item.text, PLACES[n % len(PLACES)], item.language,
                              item.caller))
        found[item.kind][0] += 1
        if any(s in out or json.dumps(s)[1:-1] in out for s in item.secrets):
            misses.append((item, out))
        else:
            found[item.kind][1] += 1
    fp_texts: list[tuple[str, str]] = []
    for n, text in enumerate(LOOK_ALIKES):
        out = _exported(redactor, f"alike-{n}",
                        _call(n, text, PLACES[n % len(PLACES)], "de-DE" if n % 3 == 0 else None))
        if "REDACTED" in out:
            fp_texts.append((text, out))
    return ({k: tuple(v) for k, v in found.items()}, (len(fp_texts), len(LOOK_ALIKES)),
            misses, fp_texts)


@pytest.fixture(scope="module")
def measured():
    return measure()


def test_at_least_95_percent_of_the_corpus_is_masked(measured):
    found, _fps, misses, _ = measured
    total = sum(n for n, _ok in found.values())
    masked = sum(ok for _n, ok in found.values())
    assert total >= 200
    assert masked / total >= 0.95, (table(found, measured[1]),
                                    [(m.text, out) for m, out in misses])


def test_at_most_2_percent_of_the_look_alikes_are_masked(measured):
    _found, (fp, n), _misses, fp_texts = measured
    assert n >= 70 and fp / n <= 0.02, fp_texts


def test_every_kind_is_found_at_least_mostly(measured):
    found = measured[0]
    for kind, (n, ok) in found.items():
        assert ok / n >= 0.8, (kind, n, ok)


@pytest.mark.parametrize("text,kept", [
    ("My IBAN is GB29 NWBK 6016 1331 9268 19, sort it out", ["My IBAN is ", ", sort it out"]),
    ("call me on +1 555 123 4567 tomorrow after lunch", ["call me on ", " tomorrow after lunch"]),
    ("it's four one five, five five five, two six seven one, thanks", ["it's ", ", thanks"]),
    ("it's anna dot berg at firma dot de, bye", ["it's ", ", bye"]),
    ("born on 14 March 1985 in Leeds", ["born on ", " in Leeds"]),
])
def test_no_sentence_is_swallowed(text, kept):
    out = _exported(_redactor(), "sentence", _call(0, text, "arg"))
    assert "[REDACTED:" in out
    for piece in kept:
        assert piece in out, out


def test_a_local_number_is_read_in_the_region_the_call_shows():
    """A German local number: kept as digits by the default regions (US, GB), masked once
    the call's language is German or the caller gave a +49 number earlier."""
    text = "oder mobil 0171 2345678"
    r = _redactor()
    assert "2345678" in _exported(r, "plain", _call(0, text, "arg"))
    assert "2345678" not in _exported(r, "lang", _call(0, text, "arg", language="de-DE"))
    assert "2345678" not in _exported(r, "caller", _call(0, text, "arg",
                                                          caller="+49 30 12345678"))
    # what one call taught is not used for another
    assert "2345678" in _exported(r, "other", _call(0, text, "arg"))
