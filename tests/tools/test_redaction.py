"""Redaction (pure): secrets are always masked; configured fields when redaction is on."""

from __future__ import annotations

import json

import pytest

from session_store import events as ev
from session_store.audit import (MASK, RedactionConfig, Redactor, export_line, load_config,
                                 state_view)
from session_store.lineage import in_model
from session_store.projection import fold

from .helpers import SECRET, chain, support_call


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


@pytest.mark.parametrize("key", ["api_key", "API-Key", "x_apikey", "access_token", "authToken",
                                 "client_secret", "password", "db.passwd", "Authorization",
                                 "private_key", "aws_credentials", "refresh_token"])
def test_secret_keys_are_always_masked_at_any_depth(key):
    data = {"settings": {"nested": [{key: "s3cr3t-value", "fine": "kept"}]}}
    out, masked = Redactor().redact_data("session.opened", data)
    assert "s3cr3t-value" not in dumps(out)
    assert out["settings"]["nested"][0]["fine"] == "kept"
    assert masked == [f"data.settings.nested[0].{key}"]


@pytest.mark.parametrize("text", [
    f"key is {SECRET} ok", "AIzaSyA-1234567890abcdefghijklmnop", "Bearer abc.def.ghi-123",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "failed: api_key=abcd1234 rejected", "token: 'xyz98765'", "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "AKIAABCDEFGHIJKLMNOP"])
def test_credential_looking_strings_are_always_scrubbed(text):
    out, masked = Redactor().redact_data("tool.call_failed", {"call_id": "c1", "error": text})
    assert MASK in out["error"] and masked == ["data.error"]
    for secret in ("sk-SECRET", "AIzaSy", "abc.def", "eyJhbG", "abcd1234", "xyz98765", "ghp_",
                   "AKIAAB"):
        assert secret not in out["error"]


def test_without_redaction_only_secrets_go():
    recs = chain("support-1", support_call())
    r = Redactor()
    out = [export_line(x, r) for x in recs]
    text = dumps(out)
    assert SECRET not in text and "tok-SECRET" not in text and "hunter2" not in text
    # the rest is what support needs to read
    assert "bob@example.com" in text and "Kore" in text and '"h-1"' in text
    assert out[0]["redacted"] == ["data.settings.api_key"]


def test_full_redaction_masks_transcripts_settings_handles_and_configured_keys():
    recs = chain("support-1", support_call())
    r = Redactor(load_config(redact=True, env={}))
    out = [export_line(x, r) for x in recs]
    text = dumps(out)
    for gone in (SECRET, "tok-SECRET", "hunter2", "bob@example.com", "Kore", "Puck",
                 "Where is my order", "has shipped", '"h-1"', '"h-2"'):
        assert gone not in text, gone
    requested = out[5]["data"]
    assert requested["args"] == {"order_id": 42, "email": MASK, "auth_token": MASK}
    assert requested["name"] == "lookup_order"  # what was called stays visible
    # handles become fingerprints: still comparable, not usable
    assert out[2]["data"]["handle"] == out[15]["data"]["handle"] != "h-1"
    assert out[2]["data"]["handle"].startswith("handle:")
    assert out[11]["data"]["result"] == {"status": "shipped", "password": MASK}


@pytest.mark.parametrize("key", ["phoneNumber", "PhoneNumber", "phone-number", "Phone Number",
                                 "dateOfBirth", "date-of-birth", "cardNumber", "accountNumber",
                                 "e-mail", "E_MAIL", "post.code"])
def test_configured_keys_match_however_the_tool_spells_them(key):
    """Tool schemas name their fields in camelCase as often as in snake_case (Gemini's own
    API does): `phone_number` in the key list must mask `phoneNumber` and `phone-number`,
    as the secret words already match whatever the separators and case."""
    r = Redactor(load_config(redact=True, env={}))
    args = {"customer": {key: "+44 7700 900123", "order_id": 42}}
    out, masked = r.redact_data("tool.call_requested",
                                {"call_id": "c1", "name": "lookup", "args": args, "generation": 1})
    assert out["args"]["customer"] == {key: MASK, "order_id": 42}, key
    assert masked == [f"data.args.customer.{key}"]


def test_json_text_in_a_value_is_redacted_by_its_keys_too():
    """A tool that returns `json.dumps(record)` (or takes JSON text as an argument) puts its
    keys inside a string: they are keys all the same. A secret key in it goes always, a
    configured one under --redact; the rest of the text stays readable."""
    result = json.dumps({"status": "shipped", "customer": {"email": "bob@example.com",
                                                           "private_key": "pk-9f8e7d6c5b"}})
    data = {"call_id": "c1", "result": result}
    out, masked = Redactor().redact_data("tool.call_completed", data)
    assert "pk-9f8e7d6c5b" not in out["result"] and "bob@example.com" in out["result"]
    assert json.loads(out["result"])["customer"]["private_key"] == MASK
    assert masked == ["data.result"]
    full = Redactor(load_config(redact=True, env={}))
    out, masked = full.redact_data("tool.call_completed", data)
    assert json.loads(out["result"]) == {"status": "shipped", "customer": {
        "email": MASK, "private_key": MASK}}
    args = {"query": json.dumps([{"phone": "+44 7700 900123"}])}
    out, _ = full.redact_data("tool.call_requested", {"call_id": "c1", "name": "find",
                                                      "args": args, "generation": 1})
    assert "7700" not in out["args"]["query"]
    # Text that only looks like JSON, or holds nothing to mask, is left as it was.
    for text in ("{not json", '{"status": "shipped"}', "[1, 2]"):
        assert Redactor().redact_data("tool.call_completed", {"call_id": "c1",
                                                              "result": text})[0]["result"] == text


BAD_CONFIGS = ['keys = "email"', "keys = [1, 2]", 'secret_keys = "pin"',
               'secret_patterns = ["("]', 'enabled = "no"', "transcripts = 0",
               'handles = "false"', 'replace_default_keys = "no"']


@pytest.mark.parametrize("line", BAD_CONFIGS)
def test_a_redaction_config_of_the_wrong_shape_is_refused_in_one_line(tmp_path, line):
    """A setting of the wrong type is bad input, said with the file and the setting: never
    a traceback (`keys = "email"` was a TypeError, an invalid pattern re.error), and never
    read as something else (`enabled = "no"` switched redaction on, `transcripts = 0` off)."""
    from typer.testing import CliRunner

    from session_store.commands.cli import app

    cfg_file = tmp_path / "redact.toml"
    cfg_file.write_text(f"[redaction]\n{line}\n")
    with pytest.raises(ValueError, match=line.split()[0]):
        Redactor(load_config(path=str(cfg_file), env={}))
    r = CliRunner().invoke(app, ["export", "c1", "--redact-config", str(cfg_file), "--db",
                                 f"sqlite+aiosqlite:///{tmp_path / 'none.db'}"])
    assert r.exit_code == 2 and r.output.startswith("error: redaction config:"), r.output
    assert line.split()[0] in r.output and "Traceback" not in r.output


def test_keys_from_option_env_and_file(tmp_path):
    cfg_file = tmp_path / "redact.toml"
    cfg_file.write_text('[redaction]\nkeys = ["order_*"]\ntool_results = "all"\n'
                        'transcripts = false\n')
    cfg = load_config(path=str(cfg_file), keys="status", env={})
    assert cfg.enabled  # keys imply redaction
    r = Redactor(cfg)
    args, _ = r.redact_data("tool.call_requested",
                            {"call_id": "c", "name": "n", "args": {"order_id": 1, "x": 2},
                             "generation": 1})
    assert args["args"] == {"order_id": MASK, "x": 2}
    result, _ = r.redact_data("tool.call_completed", {"call_id": "c", "result": {"a": [1, "b"]}})
    assert result["result"] == {"a": [MASK, MASK]}
    text, _ = r.redact_data("conversation.message", {"role": "user", "text": "hello"})
    assert text["text"] == "hello"
    env = load_config(env={"SESSION_STORE_REDACT_KEYS": "sku"})
    assert env.enabled and "sku" in env.keys and "email" in env.keys
    bad = tmp_path / "bad.json"
    bad.write_text('{"tool_args": "some"}')
    with pytest.raises(ValueError, match="tool_args"):
        load_config(path=str(bad), env={})
    bad.write_text('{"nonsense": 1}')
    with pytest.raises(ValueError, match="unknown redaction setting"):
        load_config(path=str(bad), env={})


def test_redacted_records_still_decode_and_fold():
    recs = chain("support-1", support_call())
    r = Redactor(load_config(redact=True, env={}))
    state = fold(r.redact_records(recs))
    assert state.calls["c1"].status == "completed" and in_model(state, state.calls["c1"])


def test_state_view_is_redacted_too():
    recs = chain("support-1", support_call())
    view = state_view(fold(recs))
    plain = Redactor().redact_state(view)
    assert SECRET not in dumps(plain) and "hunter2" not in dumps(plain)
    assert "bob@example.com" in dumps(plain)
    full = Redactor(load_config(redact=True, env={})).redact_state(view)
    text = dumps(full)
    for gone in (SECRET, "hunter2", "bob@example.com", "Kore", "has shipped", '"h-2"'):
        assert gone not in text, gone
    assert full["tool_calls"][0]["status"] == "completed"
    assert {"role": "tool", "text": "c1"} in full["conversation"]


def test_unreadable_payload_is_scrubbed_not_leaked():
    rec = chain("x", [(0, ev.SessionOpened("m", [], "w"))])[0]
    from dataclasses import replace
    broken = replace(rec, data_json='{"api_key": "' + SECRET + '", oops')
    line = export_line(broken, Redactor())
    assert SECRET not in dumps(line) and line["redacted"] == ["data"]


def test_raw_server_text_in_anomalies_is_masked_when_redacting():
    """A malformed frame's start (or an unstorable value's) may quote transcripts or tool
    arguments: masked under full redaction; the kind and sizes stay."""
    frame = '{"toolCall": {"functionCalls": [{"args": {"note": "Call me at 555-0100"}}'
    recs = chain("hostile-1", [(0, ev.AnomalyRecorded("malformed_message", {
        "frame": frame, "bytes": 4096, "error": f"ValueError: Failed to parse: {frame}"}, 1))])
    plain = export_line(recs[0], Redactor(load_config(redact=False, env={})))
    assert plain["data"]["detail"]["frame"] == frame
    out = export_line(recs[0], Redactor(load_config(redact=True, env={})))
    assert "555-0100" not in dumps(out)
    assert out["data"]["kind"] == "malformed_message" and out["data"]["detail"]["bytes"] == 4096


def test_raw_text_in_anomalies_is_masked_whatever_the_config_shows():
    """Such text is cut short, so no key in it can be matched: under full redaction it is
    masked whole, also when the config shows transcripts (an unstorable tool result's
    preview holds the result's personal data, which the key list exists to hide)."""
    preview = ('{"call_id": "c1", "result": {"email": "bob@example.com", "note": "'
               + "x" * 160 + '… (4000 chars)')
    recs = chain("hostile-1", [(0, ev.AnomalyRecorded("unstorable_event", {
        "type": "tool.call_completed", "error": "surrogates not allowed",
        "preview": preview}, 1))])
    shows_transcripts = Redactor(RedactionConfig(enabled=True, transcripts=False))
    out = export_line(recs[0], shows_transcripts)
    assert "bob@example.com" not in dumps(out), out["data"]["detail"]["preview"]
    assert out["data"]["detail"]["type"] == "tool.call_completed"


def test_a_message_logged_with_the_role_tool_is_masked_in_the_state():
    """The state lists a call's result in the conversation as ("tool", call id), and a
    conversation.message as (role, text): one logged with the role "tool" (other code, an
    edited row) must not pass for a call id and keep its transcript under --redact."""
    recs = chain("odd-1", [(0, ev.SessionOpened("m", ["lookup"], "w")), (0, ev.Connected(1)),
                           (10, ev.ConversationMessage("tool", "I am bob@example.com", 1))]
                 + support_call()[5:12])
    full = Redactor(load_config(redact=True, env={})).redact_state(state_view(fold(recs)))
    assert "bob@example.com" not in dumps(full["conversation"]), full["conversation"]
    assert {"role": "tool", "text": "c1"} in full["conversation"]  # a call's result: its id


def test_json_text_redacted_stays_text_every_output_can_write():
    """JSON text in a value may escape a lone surrogate (valid JSON, not valid Unicode once
    decoded): redacted, it is written back escaped, never as a str UTF-8 refuses."""
    result = '{"api_key": "k-123456", "note": "\\ud800"}'
    out, masked = Redactor().redact_data("tool.call_completed", {"call_id": "c1",
                                                                 "result": result})
    assert masked == ["data.result"] and "k-123456" not in out["result"]
    out["result"].encode("utf-8")  # no UnicodeEncodeError
    assert json.loads(out["result"]) == {"api_key": MASK, "note": "\ud800"}


@pytest.mark.parametrize("text", ["xoxb-1234567890-abcdefghij", "xoxp-0987654321-zyxwvutsrq"])
def test_slack_tokens_are_always_scrubbed(text):
    """Every credential pattern the always-level lists is applied (a Slack token in a tool
    error, e.g. a webhook call that failed)."""
    out, masked = Redactor().redact_data("tool.call_failed",
                                         {"call_id": "c1", "error": f"slack said no: {text}"})
    assert text not in out["error"] and MASK in out["error"] and masked == ["data.error"]


def test_json_text_with_nothing_to_mask_is_left_byte_for_byte():
    """JSON text is parsed to find keys in it; when nothing in it goes, the string is the
    stored one, however it is spaced (an unredacted export re-hashes to the stored chain),
    and no path is listed as masked."""
    for text in ('{"status":"shipped","items":[1,2]}', '[ {"a" : 1} ]', '{"note": "caf\\u00e9"}'):
        out, masked = Redactor().redact_data("tool.call_completed", {"call_id": "c1",
                                                                     "result": text})
        assert (out["result"], masked) == (text, []), text


def test_a_type_this_code_does_not_know_keeps_its_shape_under_redaction():
    """"Every value of an event type ... newer than the code is masked (names and shape stay,
    listed in `redacted`)": nested objects stay objects, lists stay lists, None stays None."""
    data = {"generation": 1, "speaker": {"name": "Bob", "email": "bob@example.com"},
            "words": ["hello", "there"], "confidence": None}
    out, masked = Redactor(load_config(redact=True, env={})).redact_data(
        "conversation.user_transcript", data)
    assert out == {"generation": MASK, "speaker": {"name": MASK, "email": MASK},
                   "words": [MASK, MASK], "confidence": None}
    assert masked == ["data.generation", "data.speaker.email", "data.speaker.name",
                      "data.words[0]", "data.words[1]"]


def test_a_schema_version_newer_than_the_code_is_masked_whole():
    """A row of a known type at a newer schema version: which field means what there is
    unknown here, so every value goes under --redact, including fields whose names this
    code knows (`args` may be shaped otherwise, its keys no longer the tool's)."""
    from dataclasses import replace

    rec = chain("newer-2", [(0, ev.ToolCallRequested("c1", "lookup_order",
                                                     {"order_ref": "A-1", "note": "Bob"}, 1))])[0]
    newer = replace(rec, schema_version=ev.ToolCallRequested.SCHEMA + 1)
    line = export_line(newer, Redactor(load_config(redact=True, env={})))
    assert line["data"] == {"call_id": MASK, "name": MASK, "generation": MASK,
                            "args": {"order_ref": MASK, "note": MASK}, "mode": MASK,
                            "declared": None}
    # At its own schema version only the configured keys go.
    assert export_line(rec, Redactor(load_config(redact=True, env={})))["data"]["args"] == {
        "order_ref": "A-1", "note": "Bob"}


def test_all_results_mode_masks_failure_errors_in_events_and_state():
    """`tool_results = "all"` masks every result leaf, and a failure's error (it may quote
    what the tool got back) in the event and in the state view alike."""
    recs = chain("fail-1", [(0, ev.SessionOpened("m", ["lookup"], "w")), (0, ev.Connected(1)),
                            (10, ev.ToolCallRequested("c1", "lookup", {"id": 1}, 1)),
                            (20, ev.ToolCallStarted("c1", 1, "k", 1)),
                            (30, ev.ToolCallFailed("c1", "no order for bob@example.com"))])
    r = Redactor(RedactionConfig(enabled=True, tool_results="all"))
    line = export_line(recs[-1], r)
    assert line["data"]["error"] == MASK and line["redacted"] == ["data.error"]
    view = r.redact_state(state_view(fold(recs)))
    assert view["tool_calls"][0]["error"] == MASK
    # by default ("keys") the error is the diagnostic and stays, less the personal data in it
    assert Redactor(load_config(redact=True, env={})).redact_state(
        state_view(fold(recs)))["tool_calls"][0]["error"] == "no order for [REDACTED:email]"


def test_a_config_files_keys_add_to_the_default_keys(tmp_path):
    """`keys = ["card_ref"]` in a file is added to the default keys (docs/postmortem.md:
    "added to the default keys"); `replace_default_keys = true` replaces them."""
    args = {"card_ref": "4111-1111", "email": "bob@example.com", "order_id": 42}
    data = {"call_id": "c1", "name": "pay", "args": args, "generation": 1}
    cfg_file = tmp_path / "redact.toml"
    cfg_file.write_text('[redaction]\nenabled = true\nkeys = ["card_ref"]\n')
    out, _ = Redactor(load_config(path=str(cfg_file), env={})).redact_data(
        "tool.call_requested", data)
    assert out["args"] == {"card_ref": MASK, "email": MASK, "order_id": 42}
    cfg_file.write_text('[redaction]\nenabled = true\nkeys = ["card_ref"]\n'
                        'replace_default_keys = true\nfree_text_pii = false\n')
    out, _ = Redactor(load_config(path=str(cfg_file), env={})).redact_data(
        "tool.call_requested", data)
    assert out["args"] == {"card_ref": MASK, "email": "bob@example.com", "order_id": 42}
    # (with the free-text scan on, as by default, the address is found in the value itself)
    cfg_file.write_text('[redaction]\nenabled = true\nkeys = ["card_ref"]\n'
                        'replace_default_keys = true\n')
    out, _ = Redactor(load_config(path=str(cfg_file), env={})).redact_data(
        "tool.call_requested", data)
    assert out["args"] == {"card_ref": MASK, "email": "[REDACTED:email]", "order_id": 42}


def test_a_replayed_settings_update_is_redacted_like_the_settings_event():
    """A divergence on a settings change carries the new values in its observation: under
    --redact they are masked there as in the logged and decided events."""
    from session_store.audit import replay

    secret_prompt = "The caller is bob@example.com"
    recs = chain("settings-1", [(0, ev.SessionOpened("m", [], "w")), (0, ev.Connected(1)),
                                (10, ev.SettingsChanged(["system_instruction"],
                                                        {"system_instruction": secret_prompt},
                                                        True))])
    d, = replay(recs).redacted(Redactor(load_config(redact=True, env={}))).divergences
    assert d.observation["observation"] == "SettingsUpdate"
    assert d.observation["values"] == {"system_instruction": MASK}
    assert secret_prompt not in dumps(d.to_json())
    plain, = replay(recs).redacted(Redactor()).divergences
    assert plain.observation["values"] == {"system_instruction": secret_prompt}


def test_a_logged_observation_is_redacted_as_the_events_it_stands_for():
    r = Redactor(load_config(redact=True, env={}))
    out, masked = r.redact_data("decision.observed", {
        "kind": "OutcomeAnswered", "events": 2, "refs": {}, "withheld": "",
        "data": {"call_id": "c1", "answer": {"answer": "cannot_tell",
                                             "reason": "no refund for bob@example.com"}}})
    assert "bob@example.com" not in json.dumps(out) and masked
    out, masked = r.redact_data("decision.observed", {
        "kind": "OutcomeAnswered", "events": 2, "refs": {}, "withheld": "",
        "data": {"call_id": "c1", "answer": {"answer": "not_an_answer",
                                             "preview": "'refunded bob@example.com'"}}})
    assert "bob@example.com" not in json.dumps(out) and masked
    out, masked = r.redact_data("decision.observed", {
        "kind": "SessionReady", "events": 1, "refs": {}, "withheld": "",
        "data": {"generation": 2, "handle": "secret-handle", "prompt_sha256": "ab"}})
    assert out["data"]["handle"] == r.fingerprint("secret-handle") != "secret-handle"
    out, _ = r.redact_data("decision.observed", {
        "kind": "SettingsUpdate", "events": 2, "refs": {}, "withheld": "",
        "data": {"keys": ["system_instruction"], "values": {"system_instruction": "be kind"}}})
    assert "be kind" not in json.dumps(out)


def test_a_transcript_flushed_is_redacted_as_the_messages_it_stands_for():
    """The caller's words are logged in their pieces (when each arrived decides whether it is
    late), and the bot's where no message holds them: masked as transcripts are."""
    r = Redactor(load_config(redact=True, env={}))
    out, masked = r.redact_data("decision.observed", {
        "kind": "TranscriptFlushed", "events": 2, "refs": {}, "withheld": "",
        "data": {"generation": 1, "words": [["I am bob@example.com", None], [" ok", 0.4]],
                 "said": "Hello bob@example.com"}})
    assert "bob@example.com" not in json.dumps(out) and masked
    assert out["data"]["words"][1][1] == 0.4  # when it arrived stays: it decides
