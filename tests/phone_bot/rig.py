"""A small fleet of the phone bot's real workers for one test: uvicorn processes of
examples.phone_bot.server on a fresh database (SQLite file or PostgreSQL schema), the local
Gemini Live server playing examples/phone_bot/gemini_script.py (or no Gemini at all), and
the Twilio stand-in (examples/phone_bot/telephony.py) in front, plus what an intruder does
by hand: a Media Streams websocket with whatever headers and `start` message it likes.

Reuses the fleet demo's worker start/stop and the crash harness's databases."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import websockets
from twilio.request_validator import RequestValidator

from examples.phone_bot.fleet import PUBLIC_URL, ROOT, Worker, _free_port, _start_workers, \
    _stop_workers
from examples.phone_bot.gemini_script import PhoneCallPlan
from examples.phone_bot.telephony import SILENCE, Balancer, PhoneCall, TwilioRestApi
from rig.crash.harness import Databases
from service.local_live import LocalLiveServer
from session_store import open_store

AUTH_TOKEN = "rig-auth-token"
__all__ = ["AUTH_TOKEN", "Intrusion", "Rig", "TwilioRestApi", "rig"]
STREAM_URL = PUBLIC_URL.replace("https://", "wss://") + "/ws"


@dataclass
class Intrusion:
    """What an intruder's stream got: refused at the handshake (HTTP status), or accepted
    and then closed by the server (its close code), and any bot audio it received."""

    handshake_status: int | None = None
    close_code: int | None = None
    close_reason: str = ""
    media: int = 0

    @property
    def refused(self) -> bool:
        return self.media == 0 and (self.handshake_status == 403 or self.close_code == 1008)


@dataclass
class Rig:
    db: str
    workdir: Path
    workers: int = 2
    gemini: bool = True  # False: Gemini's port is closed until `server.start()`
    env: dict[str, str] = field(default_factory=dict)
    plan: PhoneCallPlan = field(default_factory=PhoneCallPlan)
    fleet: list[Worker] = field(default_factory=list)
    url: str = ""
    schema: str | None = None

    async def __aenter__(self) -> Rig:
        self._stack = contextlib.AsyncExitStack()
        try:
            self._databases = Databases(self.db, self.workdir)
            self.url, self.schema = await self._databases()
            self._stack.push_async_callback(self._databases.cleanup)
            # Without `gemini`, nothing listens on its port until the test starts it.
            self.server = LocalLiveServer(self.plan.script,
                                          port=0 if self.gemini else _free_port())
            self._stack.push_async_callback(self.server.stop)
            if self.gemini:
                await self.server.start()
            gemini_env = {"GEMINI_BASE_URL": self.server.base_url,
                          "GEMINI_CA_CERT": str(self.server.cert_path)}
            env = {**os.environ, "DATABASE_URL": self.url, "DATABASE_SCHEMA": self.schema or "",
                   "PUBLIC_URL": PUBLIC_URL, "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
                   "TOOL_LEDGER": str(self.workdir / "tool-ledger.jsonl"),
                   "LOGURU_LEVEL": "INFO", **gemini_env,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                               os.environ.get("PYTHONPATH")])),
                   **self.env}
            self.fleet = await _start_workers(self.workers, env, self.workdir)
            self._stack.push_async_callback(_stop_workers, self.fleet)
            self.balancer = Balancer(PUBLIC_URL, [w.url for w in self.fleet])
            self.http = await self._stack.enter_async_context(httpx.AsyncClient(timeout=10))
            self.store = await open_store(self.url, **({"schema": self.schema}
                                                       if self.schema else {}))
            self._stack.push_async_callback(self.store.close)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stack.aclose()

    def phone_call(self, n: int, **kwargs) -> PhoneCall:
        """Caller n (order 1000+n), hanging up once the goodbye played, unless told otherwise."""
        caller = f"+1555000{1000 + n}"
        plan = self.plan

        def after_goodbye(call: PhoneCall) -> bool:
            closing = plan.closing_sent.get(call.from_number)
            stream = call.streams[-1]
            return (closing is not None and bool(stream.media) and stream.media[-1][0] > closing
                    and time.time() - stream.media[-1][0] > 0.8)

        kwargs.setdefault("hang_up_when", after_goodbye)
        return PhoneCall(self.balancer, f"{PUBLIC_URL}/twiml", caller, auth_token=AUTH_TOKEN,
                         **kwargs)

    async def call_heard(self, n: int, timeout_s: float = 60.0):
        """Caller n placed and on the line: returns (call, its running task) once the bot's
        first audio reached them."""
        call = self.phone_call(n)
        running = asyncio.create_task(call.run(self.http))
        deadline = time.monotonic() + timeout_s
        while not (call.streams and call.streams[-1].media):
            if time.monotonic() > deadline or running.done():
                raise AssertionError(f"no bot audio reached caller {n}: {call.error}")
            await asyncio.sleep(0.05)
        return call, running

    async def twiml_parameters(self, call: PhoneCall) -> dict[str, str]:
        """The webhook asked again for `call` (as Twilio would after a redirect): the
        `<Parameter>`s of the stream it hands out."""
        import xml.etree.ElementTree as ET
        document = await call._webhook(self.http, f"{PUBLIC_URL}/twiml", "POST")
        stream = ET.fromstring(document).find("Connect/Stream")
        return {p.get("name"): p.get("value") for p in stream.findall("Parameter")}

    async def intrude(self, worker: Worker, call_sid: str, parameters: dict[str, str], *,
                      auth_token: str | None = AUTH_TOKEN, listen_s: float = 3.0) -> Intrusion:
        """A Media Streams websocket opened by hand on `worker`: connected, start (with
        `parameters` as customParameters), then caller audio for `listen_s`; its handshake
        signed with `auth_token` (None: not signed)."""
        headers = {}
        if auth_token:
            headers["X-Twilio-Signature"] = RequestValidator(auth_token).compute_signature(
                STREAM_URL, {})
        result = Intrusion()
        try:
            websocket = await websockets.connect(f"ws://127.0.0.1:{worker.port}/ws",
                                                 additional_headers=headers)
        except websockets.InvalidStatus as exc:
            result.handshake_status = exc.response.status_code
            return result
        stream_sid = "MZ" + uuid.uuid4().hex
        async with websocket:
            await websocket.send(json.dumps({"event": "connected", "protocol": "Call",
                                             "version": "1.0.0"}))
            await websocket.send(json.dumps({"event": "start", "sequenceNumber": "1",
                                             "streamSid": stream_sid, "start": {
                "accountSid": "AC" + "0" * 32, "streamSid": stream_sid, "callSid": call_sid,
                "tracks": ["inbound"], "customParameters": parameters,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                "channels": 1}}}))

            async def listen() -> None:
                async for message in websocket:
                    if json.loads(message).get("event") == "media":
                        result.media += 1

            async def talk() -> None:
                payload = base64.b64encode(SILENCE).decode()
                for i in range(int(listen_s / 0.02)):
                    await websocket.send(json.dumps({"event": "media", "streamSid": stream_sid,
                                                     "media": {"payload": payload,
                                                               "chunk": str(i + 1)}}))
                    await asyncio.sleep(0.02)

            with contextlib.suppress(websockets.ConnectionClosed):
                await asyncio.wait_for(asyncio.gather(listen(), talk()), listen_s + 2)
        result.close_code = websocket.close_code
        result.close_reason = websocket.close_reason or ""
        return result

    def worker_at(self, url: str) -> Worker:
        found = [w for w in self.fleet if w.url == url]
        assert len(found) == 1, f"no worker of the rig at {url!r}: {[w.url for w in self.fleet]}"
        return found[0]

    def another_worker(self, url: str) -> Worker:
        found = [w for w in self.fleet if w.url != url]
        assert found, f"no worker but {url!r}: {[w.url for w in self.fleet]}"
        return found[0]

    async def readyz(self, worker: Worker) -> tuple[int, dict]:
        response = await self.http.get(f"{worker.url}/readyz")
        return response.status_code, response.json()

    async def records(self, call_sid: str):
        return await self.store.read(call_sid)

    async def closed_records(self, call_sid: str, timeout_s: float = 15.0):
        """The call's log once it has its session.closed (the worker logs a hang-up a
        moment after the caller's side is done)."""
        deadline = time.monotonic() + timeout_s
        while True:
            records = await self.store.read(call_sid)
            if any(r.type == "session.closed" for r in records) or time.monotonic() > deadline:
                return records
            await asyncio.sleep(0.1)

    def worker_log(self, worker: Worker) -> str:
        return worker.log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def rig(db: str, workdir: Path | None = None, **kwargs):
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rig-")))
        async with Rig(db, workdir, **kwargs) as r:
            yield r
