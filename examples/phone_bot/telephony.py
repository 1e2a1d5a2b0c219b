"""A telephony stand-in: Twilio's side of a phone call, for tests and the fleet demo.

`PhoneCall` does what Twilio does for one inbound call to a number whose voice webhook is
the bot: it POSTs the webhook (signed like Twilio when given an auth token), follows the
TwiML, opens the `<Connect><Stream>` websocket and speaks the Media Streams protocol on it
(`connected`, `start` with callSid/streamSid, 20 ms μ-law `media` frames, `mark` echoed
once the audio before it has played, `stop` when the caller hangs up), and records what the
bot sends back. When the stream closes while the caller is still on the line (the worker
serving it died), it goes on with the next verb, the `<Redirect>` to the webhook: the call
reconnects, to whichever worker the load balancer picks, with the same CallSid.

`Balancer` stands in for the load balancer in front of the workers: the public address
(PUBLIC_URL) resolves to the next worker, round-robin, skipping one that refuses
connections for a while (what a load balancer's passive health check does). It lives
here, not as a proxy process, so the measured gaps have no extra hop in them.

Not part of the product: nothing under service/ or session_store/ imports it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import math
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx
import websockets
from websockets.exceptions import InvalidMessage
from twilio.request_validator import RequestValidator

from .hearing import pcm_to_ulaw

FRAME_MS = 20
FRAME_BYTES = 160  # 20 ms of 8 kHz μ-law
SILENCE = b"\xff" * FRAME_BYTES  # μ-law of 0
DOWN_FOR_S = 2.0


class Balancer:
    """The load balancer in front of the workers (http://127.0.0.1:PORT each), reached at
    `public_url`: webhooks go round-robin, a Media Streams websocket to the worker with the
    fewest open streams (least connections, as one sets a balancer for long-lived
    websockets). A worker that refuses a connection, or drops it before answering (it died
    during the handshake), is left out for DOWN_FOR_S and the request goes to another, as
    nginx's default `proxy_next_upstream error timeout` does; an answer (a 403) is final."""

    def __init__(self, public_url: str, workers: list[str]):
        self.public = urlsplit(public_url)
        self.workers = list(workers)
        self.open_streams: dict[str, int] = {w: 0 for w in self.workers}
        self._next = 0
        self._down_until: dict[str, float] = {}

    def _up(self) -> list[str]:
        now = time.monotonic()
        up = [w for w in self.workers if self._down_until.get(w, 0.0) <= now]
        if not up:
            raise ConnectionError("no worker is up behind the load balancer")
        return up

    def pick(self) -> str:
        """For a request: round-robin."""
        up = self._up()
        self._next += 1
        return up[self._next % len(up)]

    def pick_for_stream(self) -> str:
        """For a websocket: least connections (ties round-robin)."""
        up = self._up()
        self._next += 1
        rotated = up[self._next % len(up):] + up[:self._next % len(up)]
        return min(rotated, key=lambda w: self.open_streams[w])

    def failed(self, worker: str) -> None:
        self._down_until[worker] = time.monotonic() + DOWN_FOR_S

    def route(self, url: str, worker: str) -> str:
        """`url` (on the public address) as sent to `worker` (TLS ends at the balancer)."""
        parts = urlsplit(url)
        if parts.netloc != self.public.netloc:
            raise ValueError(f"{url} is not behind this load balancer ({self.public.netloc})")
        target = urlsplit(worker)
        scheme = {"https": "http", "wss": "ws"}.get(parts.scheme, parts.scheme)
        return urlunsplit((scheme, target.netloc, parts.path, parts.query, ""))


@dataclass
class Stream:
    """One Media Streams websocket of a call, as Twilio saw it."""

    stream_sid: str
    worker: str
    opened_at: float
    closed_at: float | None = None
    close_code: int | None = None
    ended_by: str | None = None  # "caller" (stop sent) or "bot" (the websocket closed)
    media: list[tuple[float, int]] = field(default_factory=list)  # bot audio: (at, bytes)
    audio: list[tuple[float, bytes]] = field(default_factory=list)  # (at, μ-law) as received
    marks: list[str] = field(default_factory=list)  # marks echoed after playback
    clears: int = 0
    cleared_at: list[float] = field(default_factory=list)
    sent_frames: int = 0  # caller audio frames sent

    @property
    def first_audio_at(self) -> float | None:
        return self.media[0][0] if self.media else None


@dataclass
class Webhook:
    at: float  # answered
    worker: str
    status: int
    twiml: str
    asked_at: float = 0.0  # the request went out (the last try's, after refused ones)


@dataclass
class PhoneCall:
    """One inbound call, from ringing to hang-up.

    `hang_up_when(call)` is asked every 100 ms while a stream is open: True makes the
    caller hang up (`stop`, then the websocket closes). The caller speaks `speech_s` of a
    tone once the bot's first turn has played, silence otherwise (Twilio streams the
    caller's audio all the time); with `speak_over_after_s`, that long into the bot's first
    audio instead, over the bot (`spoke_over_at` says when). With `voice`, they speak a
    synthetic voice instead of the tone: what a voice detector takes for speech."""

    balancer: Balancer
    webhook_url: str
    from_number: str
    to_number: str = "+15550100000"
    hang_up_when: Callable[[PhoneCall], bool] = lambda call: False
    auth_token: str | None = None
    account_sid: str = "AC" + "0" * 32
    call_sid: str = field(default_factory=lambda: "CA" + uuid.uuid4().hex)
    speech_s: float = 1.0
    max_redirects: int = 10
    timeout_s: float = 180.0
    streams: list[Stream] = field(default_factory=list)
    webhooks: list[Webhook] = field(default_factory=list)
    speak_over_after_s: float | None = None
    voice: bool = False
    spoke_over_at: float | None = None
    said: list[str] = field(default_factory=list)  # <Say> texts heard
    dialed: list[str] = field(default_factory=list)  # <Dial> numbers transferred to
    # After an abrupt close of the stream (1006, its worker died): "redirect" goes on with
    # the next verb, "nothing" waits for a REST update of the call (TwilioRestApi).
    after_abrupt_close: str = "redirect"
    status: str = "ringing"
    hung_up_at: float | None = None
    error: str | None = None
    rest_updates: list[tuple[float, str]] = field(default_factory=list)  # (at, Url)
    _spoke: bool = False
    _pending_update: tuple[str, str] | None = None

    def rest_update(self, url: str, method: str) -> None:
        """The call updated through the REST API with a new TwiML URL (followed once the
        stream, if one is open, has ended)."""
        self.rest_updates.append((time.time(), url))
        self._pending_update = (url, method)

    async def run(self, http: httpx.AsyncClient) -> PhoneCall:
        if self.voice:  # made now, not in the middle of the caller's real-time audio
            await asyncio.to_thread(_voice, self.speech_s)
        try:
            await asyncio.wait_for(self._run(http), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the record says what went wrong
            self.error = f"{type(exc).__name__}: {exc}"
        return self

    async def _run(self, http: httpx.AsyncClient) -> None:
        url, method = self.webhook_url, "POST"
        for _ in range(self.max_redirects + 1):
            document = await self._webhook(http, url, method)
            url = None
            for verb in ET.fromstring(document):
                if verb.tag == "Say":
                    self.said.append(verb.text or "")
                elif verb.tag == "Dial":  # the caller is transferred: the call leaves the bot
                    self.dialed.append((verb.text or "").strip())
                    self.status = "completed"
                    return
                elif verb.tag == "Hangup":
                    self.status = "completed"
                    return
                if verb.tag == "Connect":
                    stream = verb.find("Stream")
                    parameters = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
                    await self._stream(stream.get("url"), parameters)
                    if self.status == "completed":
                        return
                    if self.after_abrupt_close == "nothing" and self.streams[-1].close_code == 1006:
                        # Undocumented: this Twilio waits, on the line, for a REST update.
                        while self._pending_update is None:
                            await asyncio.sleep(0.02)
                        (url, method), self._pending_update = self._pending_update, None
                        break
                elif verb.tag == "Redirect":
                    url, method = verb.text.strip(), verb.get("method", "POST")
                    break
            if url is None:
                self.status = "completed"  # the TwiML ran out: Twilio ends the call
                return
        raise RuntimeError(f"more than {self.max_redirects} redirects")

    async def _webhook(self, http: httpx.AsyncClient, url: str, method: str) -> str:
        params = {"AccountSid": self.account_sid, "ApiVersion": "2010-04-01",
                  "CallSid": self.call_sid, "CallStatus": self.status, "Direction": "inbound",
                  "From": self.from_number, "To": self.to_number, "Caller": self.from_number,
                  "Called": self.to_number}
        headers = {}
        if self.auth_token:
            headers["X-Twilio-Signature"] = RequestValidator(self.auth_token).compute_signature(
                url, params)
        while True:
            worker = self.balancer.pick()
            asked_at = time.time()
            try:
                response = await http.request(method, self.balancer.route(url, worker),
                                              data=params, headers=headers)
            except httpx.TransportError:  # refused, or a kept-alive connection reset
                self.balancer.failed(worker)
                continue
            self.webhooks.append(Webhook(time.time(), worker, response.status_code,
                                         response.text, asked_at))
            response.raise_for_status()
            self.status = "in-progress"
            return response.text

    async def _stream(self, url: str, parameters: dict[str, str]) -> None:
        # Twilio signs the handshake like a GET of the stream's URL, with no parameters.
        headers = {"X-Twilio-Signature": RequestValidator(self.auth_token).compute_signature(
            url, {})} if self.auth_token else {}
        while True:
            worker = self.balancer.pick_for_stream()
            try:
                websocket = await websockets.connect(self.balancer.route(url, worker),
                                                     max_size=None, additional_headers=headers)
                break
            except (OSError, InvalidMessage):  # refused, or closed before its response
                self.balancer.failed(worker)
        stream = Stream("MZ" + uuid.uuid4().hex, worker, time.time())
        self.streams.append(stream)
        self.balancer.open_streams[worker] += 1
        try:
            await self._media(websocket, stream, parameters)
        finally:
            self.balancer.open_streams[worker] -= 1

    async def _media(self, websocket, stream: Stream, parameters: dict[str, str]) -> None:
        async with websocket:
            await websocket.send(json.dumps({"event": "connected", "protocol": "Call",
                                             "version": "1.0.0"}))
            await websocket.send(json.dumps({
                "event": "start", "sequenceNumber": "1", "streamSid": stream.stream_sid,
                "start": {"accountSid": self.account_sid, "streamSid": stream.stream_sid,
                          "callSid": self.call_sid, "tracks": ["inbound"],
                          "customParameters": parameters,
                          "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                          "channels": 1}}}))
            listening = asyncio.create_task(self._listen(websocket, stream))
            talking = asyncio.create_task(self._talk(websocket, stream))
            try:
                await asyncio.wait({listening, talking}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (listening, talking):
                    task.cancel()
                await asyncio.gather(listening, talking, return_exceptions=True)
            if self.hung_up_at is not None:
                self.status = "completed"
        stream.closed_at = stream.closed_at or time.time()
        stream.ended_by = stream.ended_by or "bot"
        stream.close_code = websocket.close_code

    async def _listen(self, websocket, stream: Stream) -> None:
        """What the bot sends: audio (it plays in real time), marks, clears."""
        playing_until = 0.0  # when the audio received so far will have played out
        marks: dict[str, asyncio.Task] = {}

        async def echo(name: str, delay: float) -> None:
            await asyncio.sleep(delay)  # Twilio answers a mark once the audio before it played
            marks.pop(name, None)
            stream.marks.append(name)
            with contextlib.suppress(websockets.ConnectionClosed):  # the stream ended first
                await websocket.send(json.dumps({"event": "mark", "streamSid": stream.stream_sid,
                                                 "mark": {"name": name}}))

        try:
            async for message in websocket:
                now = time.time()
                data = json.loads(message)
                event = data.get("event")
                if event == "media":
                    payload = base64.b64decode(data["media"]["payload"])
                    size = len(payload)
                    stream.media.append((now, size))
                    stream.audio.append((now, payload))
                    playing_until = max(playing_until, now) + size / 8000
                elif event == "mark":
                    name = data["mark"]["name"]
                    marks[name] = asyncio.create_task(echo(name, max(0.0, playing_until - now)))
                elif event == "clear":
                    stream.clears += 1
                    stream.cleared_at.append(now)
                    playing_until = now  # the buffered audio is dropped: its marks come back now
                    for name, task in list(marks.items()):
                        task.cancel()
                        marks[name] = asyncio.create_task(echo(name, 0.0))
        except websockets.ConnectionClosed:
            pass
        finally:
            for task in marks.values():
                task.cancel()
        stream.closed_at = time.time()
        stream.ended_by = stream.ended_by or "bot"

    async def _talk(self, websocket, stream: Stream) -> None:
        """The caller's audio, one 20 ms frame at a time, until they hang up."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        speech: list[bytes] = []
        sequence = 1
        while True:
            if not self._spoke and self._speaks_now(stream):
                speech = list(_voice(self.speech_s)) if self.voice else _tone(self.speech_s)
                self._spoke = True
            payload = speech.pop(0) if speech else SILENCE
            sequence += 1
            stream.sent_frames += 1
            await websocket.send(json.dumps({
                "event": "media", "sequenceNumber": str(sequence), "streamSid": stream.stream_sid,
                "media": {"track": "inbound", "chunk": str(stream.sent_frames),
                          "timestamp": str(stream.sent_frames * FRAME_MS),
                          "payload": base64.b64encode(payload).decode("ascii")}}))
            if stream.sent_frames % 5 == 0 and self.hang_up_when(self):
                self.hung_up_at = time.time()
                stream.ended_by = "caller"
                await websocket.send(json.dumps({
                    "event": "stop", "sequenceNumber": str(sequence + 1),
                    "streamSid": stream.stream_sid,
                    "stop": {"accountSid": self.account_sid, "callSid": self.call_sid}}))
                await websocket.close()
                return
            next_at += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))


    def _speaks_now(self, stream: Stream) -> bool:
        if self.speak_over_after_s is None:
            return _bot_turn_over(stream)
        first = stream.first_audio_at
        if first is None or time.time() - first < self.speak_over_after_s:
            return False
        self.spoke_over_at = time.time()
        return True


def _bot_turn_over(stream: Stream, quiet_s: float = 0.3) -> bool:
    """The bot spoke on this stream and has been quiet for `quiet_s`."""
    return bool(stream.media) and time.time() - stream.media[-1][0] > quiet_s


# Formants (Hz) of five vowels, and their bandwidths: one vowel a syllable.
_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480),
           (570, 840, 2410))
_BANDWIDTHS = (90, 110, 170)


def _resonate(x, hz: float, bandwidth: float):
    """A two-pole resonator (a formant) over the signal `x`."""
    import numpy as np

    r = math.exp(-math.pi * bandwidth / 8000)
    c = 2 * r * math.cos(2 * math.pi * hz / 8000)
    y = np.zeros(len(x))
    y1 = y2 = 0.0
    for i, v in enumerate(x):
        y1, y2 = v + c * y1 - r * r * y2, y1
        y[i] = y1
    return y


@functools.lru_cache(maxsize=4)
def _voice(seconds: float) -> tuple[bytes, ...]:
    """A synthetic voice as 20 ms μ-law frames: glottal pulses (pitch 100-150 Hz, falling
    through each syllable) through the formants of a vowel, a consonant's hiss before each
    syllable, about four syllables a second. Silero VAD scores it 0.99 (the tone: 0.0) and
    starts speech about 0.36 s into it, after silence."""
    import numpy as np

    rng = np.random.default_rng(1)
    parts: list = []
    syllable = 0
    while sum(map(len, parts)) < 8000 * seconds:
        n = int(8000 * 0.22 * rng.uniform(0.8, 1.2))
        t = np.arange(n) / 8000
        pitch = rng.uniform(100, 150) * (1 - 0.15 * t / 0.22)
        pulses = np.where(np.diff(np.floor(np.cumsum(pitch) / 8000), prepend=0) > 0, 1.0, 0.0)
        for hz, bandwidth in zip(_VOWELS[syllable % len(_VOWELS)], _BANDWIDTHS):
            pulses = _resonate(pulses, hz, bandwidth)
        vowel = pulses / np.max(np.abs(pulses)) * np.sin(np.pi * np.arange(n) / n) ** 0.7
        hiss = _resonate(rng.normal(0, 1, 320), 2500, 800)
        parts += [0.25 * hiss / np.max(np.abs(hiss)), vowel]
        syllable += 1
    pcm = (np.concatenate(parts)[:int(8000 * seconds)] * 14000).astype("<i2").tobytes()
    ulaw = pcm_to_ulaw(pcm)
    return tuple(ulaw[i:i + FRAME_BYTES] for i in range(0, len(ulaw), FRAME_BYTES))


def _tone(seconds: float, hz: float = 220.0) -> list[bytes]:
    """The caller speaking: a tone as 20 ms μ-law frames."""
    samples = int(8000 * seconds)
    pcm = b"".join(int(8000 * math.sin(2 * math.pi * hz * i / 8000)).to_bytes(2, "little", signed=True)
                   for i in range(samples))
    ulaw = pcm_to_ulaw(pcm)
    return [ulaw[i:i + FRAME_BYTES] for i in range(0, len(ulaw), FRAME_BYTES)]


class TwilioRestApi:
    """Twilio's REST API, the one call it serves here: updating a live call with a new TwiML
    URL (POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json, form Url and Method,
    HTTP basic auth with the account SID and auth token). Answers like Twilio: 401 for bad
    credentials, 404 (code 20404) for a call it does not know, 400 (code 21220) for a call
    that is over. `requests` records every update asked for: (time, CallSid, status)."""

    def __init__(self, account_sid: str, auth_token: str, calls: dict[str, PhoneCall]):
        self.account_sid, self.auth_token, self.calls = account_sid, auth_token, calls
        self.requests: list[tuple[float, str, int]] = []
        self._runner = None
        self.base_url = ""

    async def __aenter__(self) -> TwilioRestApi:
        from aiohttp import web
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{call}.json", self._update)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()

    async def _update(self, request):
        from aiohttp import BasicAuth, web
        call_sid = request.match_info["call"]
        try:
            auth = BasicAuth.decode(request.headers.get("Authorization", ""))
        except ValueError:
            auth = None
        if auth is None or (auth.login, auth.password) != (self.account_sid, self.auth_token) \
                or request.match_info["account"] != self.account_sid:
            return self._answer(call_sid, 401, 20003, "Authenticate")
        call = self.calls.get(call_sid)
        if call is None:
            return self._answer(call_sid, 404, 20404, "The requested resource was not found")
        if call.status == "completed":
            return self._answer(call_sid, 400, 21220, "Call is not in-progress. Cannot redirect.")
        form = await request.post()
        if not form.get("Url"):
            return self._answer(call_sid, 400, 21205, "Url parameter is required")
        call.rest_update(form["Url"], form.get("Method", "POST"))
        self.requests.append((time.time(), call_sid, 200))
        return web.json_response({"sid": call_sid, "account_sid": self.account_sid,
                                  "status": call.status})

    def _answer(self, call_sid: str, status: int, code: int, message: str):
        from aiohttp import web
        self.requests.append((time.time(), call_sid, status))
        return web.json_response({"code": code, "message": message, "status": status,
                                  "more_info": f"https://www.twilio.com/docs/errors/{code}"},
                                 status=status)
