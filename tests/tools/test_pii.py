"""Personal data inside free text (`--redact`): a corpus of what must go and what must stay,
through the scanner, the event redaction, the state view and the CLI export."""

from __future__ import annotations

import json

import pytest

from session_store import events as ev
from session_store.audit import MASK, Redactor, load_config
from session_store.audit.export import export_line, state_view
from session_store.audit.pii import SCAN_MAX, PiiScanner
from session_store.audit.redaction import RedactionConfig
from session_store.projection import fold

from .helpers import acli, chain, write_call

#: (text, what must not survive, kinds found)
MUST_GO = [
    ("call me on +1 555 123 4567", ["555 123 4567"], ["phone"]),
    ("my number is (415) 555-2671, after 6", ["555-2671"], ["phone"]),
    ("ring 020 7946 0958 please", ["7946 0958"], ["phone"]),
    ("+44 20 7946 0958 or +33 1 23 45 67 89", ["7946 0958", "23 45 67 89"],
     ["phone", "phone"]),
    ("mail bob@example.com now", ["bob@example.com"], ["email"]),
    ("Bob.O'Neil+news@sub.example.co.uk wrote", ["O'Neil+news@sub.example.co.uk"], ["email"]),
    ("card 4111 1111 1111 1111 exp 12/29", ["4111 1111 1111 1111"], ["card"]),
    ("card 4111-1111-1111-1111", ["4111-1111-1111-1111"], ["card"]),
    ("amex 378282246310005", ["378282246310005"], ["card"]),
    ("IBAN GB82 WEST 1234 5698 7654 32 thanks", ["GB82 WEST 1234 5698 7654 32"], ["iban"]),
    ("ship to 1600 Amphitheatre Parkway, Mountain View, CA 94043 please",
     ["1600 Amphitheatre Parkway", "94043"], ["address"]),
    ("I'm at 221B Baker Street, London NW1 6XE", ["221B Baker Street", "NW1 6XE"],
     ["address"]),
]

#: Texts with numbers that are not personal data: left as they are.
MUST_STAY = [
    "order 42 shipped, 3 items",
    "order id 1234567 is on its way",
    "booked for 2026-01-01 at 14:00",
    "timestamp 1767225600 in seconds",
    "the refund of $120.50 went through",
    "version 2.14.4 of the model",
    "card ending in 1111",
    "4111 1111 1111 1112 is not a valid card number",
    "room 7, floor 3",
]


@pytest.mark.parametrize("text,gone,kinds", MUST_GO)
def test_personal_data_in_free_text_is_found(text, gone, kinds):
    masked, found = PiiScanner().mask(text)
    assert found == kinds, (text, masked)
    for piece in gone:
        assert piece not in masked, (text, masked)
    assert "[REDACTED:" in masked


@pytest.mark.parametrize("text", MUST_STAY)
def test_numbers_that_are_not_personal_data_stay(text):
    assert PiiScanner().mask(text) == (text, [])


def test_each_kind_can_be_left_out_and_regions_chosen():
    text = "ring 020 7946 0958 or bob@example.com"
    assert PiiScanner(kinds=("email",)).mask(text)[1] == ["email"]
    assert PiiScanner(regions=("US",)).mask(text)[1] == ["email"]  # a UK number, local form
    assert PiiScanner(regions=("GB",)).mask(text)[1] == ["phone", "email"]


def test_arguments_results_errors_and_transcripts_are_scanned_under_redact():
    note = "call me on +1 555 123 4567 or mail bob@example.com"
    timed = [(0, ev.SessionOpened("gemini-live", ["lookup"], "w1", 1)), (0, ev.Connected(1)),
             (100, ev.ToolCallRequested("c1", "lookup", {"note": note, "order": 42,
                                                        "nested": [{"memo": note}]}, 1)),
             (200, ev.ToolCallStarted("c1", 1, "k", 1)),
             (300, ev.ToolCallCompleted("c1", {"summary": f"shipped; {note}",
                                               "as_text": json.dumps({"memo": note})})),
             (400, ev.ToolCallRequested("c2", "lookup", {"id": 7}, 1)),
             (410, ev.ToolCallStarted("c2", 1, "k2", 1)),
             (500, ev.ToolCallFailed("c2", f"no order for {note}")),
             (600, ev.ConversationMessage("user", note, 1))]
    recs = chain("pii-1", timed)
    full = Redactor(load_config(redact=True, env={}))
    lines = [export_line(r, full) for r in recs]
    text = json.dumps(lines)
    assert "555 123 4567" not in text and "bob@example.com" not in text
    assert lines[2]["data"]["args"]["note"] == ("call me on [REDACTED:phone] or mail "
                                                "[REDACTED:email]")
    assert lines[2]["data"]["args"]["order"] == 42  # what is not personal data stays
    assert lines[2]["redacted"] == ["data.args.nested[0].memo", "data.args.note"]
    assert lines[4]["data"]["result"]["summary"].startswith("shipped; call me on [REDACTED")
    assert "[REDACTED:email]" in json.loads(lines[4]["data"]["result"]["as_text"])["memo"]
    assert lines[7]["data"]["error"].startswith("no order for call me on [REDACTED:phone]")
    assert lines[8]["data"]["text"] == MASK  # transcripts: masked whole by default
    shown = Redactor(RedactionConfig(enabled=True, transcripts=False))
    assert export_line(recs[8], shown)["data"]["text"] == ("call me on [REDACTED:phone] or "
                                                           "mail [REDACTED:email]")
    # the state view is redacted the same way, and without --redact nothing but secrets go
    view = full.redact_state(state_view(fold(recs)))
    assert "555 123 4567" not in json.dumps(view)
    assert note in json.dumps(export_line(recs[2], Redactor()))
    off = Redactor(RedactionConfig(enabled=True, free_text_pii=False))
    assert export_line(recs[2], off)["data"]["args"]["note"] == note


def test_a_text_too_long_to_scan_is_masked_whole():
    long_note = "a" * SCAN_MAX + " +1 555 123 4567"
    recs = chain("pii-2", [(0, ev.SessionOpened("m", ["t"], "w", 1)),
                           (1, ev.ToolCallRequested("c1", "t", {"note": long_note}, 1))])
    line = export_line(recs[1], Redactor(load_config(redact=True, env={})))
    assert line["data"]["args"]["note"] == MASK and line["redacted"] == ["data.args.note"]


def test_a_redaction_config_file_chooses_kinds_and_regions(tmp_path):
    cfg = tmp_path / "r.toml"
    cfg.write_text('[redaction]\nenabled = true\npii_kinds = ["email"]\n'
                   'phone_regions = ["GB"]\n')
    r = Redactor(load_config(path=str(cfg), env={}))
    out, _ = r.redact_data("tool.call_requested", {"call_id": "c", "name": "t",
                                                   "generation": 1,
                                                   "args": {"n": "+1 555 123 4567 a@b.example"}})
    assert out["args"]["n"] == "+1 555 123 4567 [REDACTED:email]"
    cfg.write_text('[redaction]\nenabled = true\npii_kinds = ["dna"]\n')
    with pytest.raises(ValueError, match="pii_kinds: unknown"):
        load_config(path=str(cfg), env={})


async def test_export_redact_masks_the_note_from_the_issue(migrated):
    """`export --redact` kept `"note": "call me on +1 555 123 4567"`: now masked, and the
    list of masked paths says where."""
    await write_call(migrated, "note-1", [
        (0, ev.SessionOpened("gemini-live", ["callback"], "w1", 1)), (0, ev.Connected(1)),
        (100, ev.ToolCallRequested("c1", "callback", {"note": "call me on +1 555 123 4567"},
                                   1))])
    r = await acli("export", "note-1", "--redact", backend=migrated)
    assert r.exit_code == 0 and "555 123 4567" not in r.stdout
    line = json.loads(r.stdout.splitlines()[2])
    assert line["data"]["args"]["note"] == "call me on [REDACTED:phone]"
    assert line["redacted"] == ["data.args.note"]
