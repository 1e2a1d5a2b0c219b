"""The example's web app over HTTP, on a real (SQLite) log: the TwiML that makes a call
come back to the fleet after its worker dies, Twilio's signature check, health."""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET

import pytest
from fastapi.testclient import TestClient
from twilio.request_validator import RequestValidator

from examples.phone_bot.server import app
from session_store import events as ev
from session_store import open_store
from session_store.storage.migrate import upgrade

PUBLIC = "https://bot.example.test"
TOKEN = "test-auth-token"


@pytest.fixture
def db_url(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'log.db'}"
    asyncio.run(upgrade(url))
    return url


@pytest.fixture
def client(db_url, monkeypatch, tmp_path):
    for key, value in {"DATABASE_URL": db_url, "PUBLIC_URL": PUBLIC, "TWILIO_AUTH_TOKEN": TOKEN,
                       "GEMINI_BASE_URL": "https://127.0.0.1:9", "MAX_CALLS": "5",
                       "TOOL_LEDGER": str(tmp_path / "ledger.jsonl")}.items():
        monkeypatch.setenv(key, value)
    with TestClient(app) as c:
        yield c


def post_twiml(client, params, *, signed_url=f"{PUBLIC}/twiml", token=TOKEN):
    signature = RequestValidator(token).compute_signature(signed_url, params)
    return client.post("/twiml", data=params, headers={"X-Twilio-Signature": signature})


CALL = {"CallSid": "CA" + "1" * 32, "From": "+15550001234", "To": "+15550100000",
        "CallStatus": "ringing", "AccountSid": "AC" + "0" * 32}


def test_the_webhook_connects_the_stream_then_redirects_to_itself(client):
    response = post_twiml(client, CALL)
    assert response.status_code == 200, response.text
    verbs = list(ET.fromstring(response.text))
    assert [v.tag for v in verbs] == ["Connect", "Redirect"]
    stream = verbs[0].find("Stream")
    assert stream.get("url") == "wss://bot.example.test/ws"  # the balancer's, not a worker's
    parameters = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    assert parameters.pop("stream_token").startswith("v1.0.")  # stream_auth.py; epoch 0
    assert parameters == {"from_number": "+15550001234"}
    assert verbs[1].text == f"{PUBLIC}/twiml" and verbs[1].get("method") == "POST"


def test_the_webhook_refuses_requests_twilio_did_not_sign(client):
    assert client.post("/twiml", data=CALL).status_code == 403
    assert post_twiml(client, CALL, token="another-token").status_code == 403
    # Signed for the URL the worker sees rather than the public one: not Twilio's signature.
    assert post_twiml(client, CALL, signed_url="http://testserver/twiml").status_code == 403
    assert post_twiml(client, {**CALL, "From": "+15559999999"} | {"To": CALL["To"]},
                      signed_url=f"{PUBLIC}/twiml").status_code == 200


def test_the_webhook_hangs_up_a_call_the_log_says_ended(client, db_url):
    async def ended_call() -> None:
        store = await open_store(db_url)
        try:
            await store.append(CALL["CallSid"], [
                ev.SessionOpened("m", ["refund_order"], "elsewhere", 1, {}),
                ev.SessionClosed("ended")], expected_version=0)
        finally:
            await store.close()

    asyncio.run(ended_call())
    response = post_twiml(client, {**CALL, "CallStatus": "in-progress"})
    assert response.status_code == 200
    assert [v.tag for v in ET.fromstring(response.text)] == ["Hangup"]


def test_the_webhook_needs_a_call_sid(client):
    params = {k: v for k, v in CALL.items() if k != "CallSid"}
    assert post_twiml(client, params).status_code == 400


def test_health_and_readiness(client, monkeypatch):
    assert client.get("/healthz").json()["ok"] is True
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    client.app.state.calls.update({f"CA{i}": object() for i in range(5)})  # MAX_CALLS=5
    try:
        full = client.get("/readyz")
        assert full.status_code == 503 and full.json()["reason"] == "full"
    finally:
        client.app.state.calls.clear()


def test_not_ready_when_the_log_does_not_answer(client):
    client.portal.call(client.app.state.store.close)
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["reason"].startswith("log:")
    assert client.get("/healthz").status_code == 200  # alive, just not taking calls


@pytest.mark.parametrize("change, says", [
    ({"DATABASE_URL": ""}, "set DATABASE_URL"),
    ({"DATABASE_URL": "  "}, "set DATABASE_URL"),
    ({"PUBLIC_URL": "bot.example.test"}, "PUBLIC_URL must be http(s)://host[:port]"),
    ({"GEMINI_BASE_URL": ""}, "set GOOGLE_API_KEY"),
    ({"GEMINI_CA_CERT": "/nowhere/ca.pem"}, "GEMINI_CA_CERT '/nowhere/ca.pem' is not a file"),
    ({"MAX_CALLS": "lots"}, "MAX_CALLS must be a whole number >= 0, not 'lots'"),
    ({"TOOL_LATENCY_S": "nan"}, "TOOL_LATENCY_S must be a number >= 0, not 'nan'"),
    ({"CALL_LEASE_S": "0"}, "CALL_LEASE_S must be a number > 0, not '0'"),
    ({"STREAM_TOKEN_TTL_S": "-1"}, "STREAM_TOKEN_TTL_S must be a number >= 0, not '-1'"),
    ({"STREAM_TOKEN_TTL_S": "0.0"}, "STREAM_TOKEN_TTL_S must be a number > 0, not '0.0'"),
])
def test_a_worker_with_bad_settings_says_what_to_set(change, says):
    from examples.phone_bot.config import BotConfig

    env = {"DATABASE_URL": "sqlite+aiosqlite:///log.db", "PUBLIC_URL": PUBLIC,
           "GEMINI_BASE_URL": "https://127.0.0.1:9", **change}
    with pytest.raises(SystemExit, match=re.escape(says)):
        BotConfig.from_env(env)
