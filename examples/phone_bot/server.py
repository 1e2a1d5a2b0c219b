"""The phone bot's web app: Twilio's voice webhook, the Media Streams websocket, health.

Run several of these (processes, hosts) behind one load balancer, all on one database:

    DATABASE_URL=postgresql+asyncpg://… PUBLIC_URL=https://bot.example.com \
        GOOGLE_API_KEY=… uvicorn examples.phone_bot.server:app --port 8000

- `POST /twiml`  the number's voice webhook. Answers `<Connect><Stream>` to this app's
  websocket, followed by `<Redirect>` back to itself: when the stream closes because the
  worker serving it died, Twilio asks the webhook again and the call reconnects, through
  the load balancer, to any worker, with the same CallSid. A call the log says ended gets
  `<Hangup/>`.
- `WS /ws`       one call's audio (bot.py).
- `GET /healthz` the process answers (liveness).
- `GET /readyz`  it can take a call: the log answers, it is below MAX_CALLS and Gemini
  answers (call_end.py).
- `GET /metrics` Prometheus metrics (docs/metrics.md): keep it off the public address.

A stream is admitted only with Twilio's signature on its handshake and the stream token the
webhook put in its TwiML (stream_auth.py); a call Gemini cannot serve ends (call_end.py).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
import uuid
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request, WebSocket
from loguru import logger
from pipecat.runner.utils import parse_telephony_websocket
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from twilio.request_validator import RequestValidator
from twilio.twiml.voice_response import Connect, VoiceResponse

from service import metrics
from service.gemini_live import DurableGeminiLiveLLMService
from session_store import load_state, open_store

from .barge_in import load_vad_model
from .bot import run_call
from .call_end import GeminiReach, close_reason, verbs_for_closed_call
from .config import BotConfig
from .rescue import CallLeases
from .stream_auth import PARAMETER, StreamGate, StreamRefused, derive_secret

READY_PROBE_TIMEOUT_S = 2.0


@asynccontextmanager
async def lifespan(app: FastAPI):
    config = BotConfig.from_env()
    app.state.config = config
    app.state.store = await open_store(config.database_url, **config.store_options())
    app.state.calls = {}
    metrics.install()
    app.state.gate = StreamGate(
        derive_secret(config.stream_token_secret, config.twilio_auth_token),
        config.stream_token_ttl_s, config.twilio_auth_token, config.stream_url)
    if not app.state.gate.enabled:
        logger.warning("media streams are NOT authenticated: set TWILIO_AUTH_TOKEN "
                       "(or STREAM_TOKEN_SECRET)")
    app.state.gemini = GeminiReach(config)
    app.state.leases = CallLeases(config, app.state.store,
                                  f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
    await app.state.leases.start()
    await load_vad_model()  # once per process, off the loop: calls share it (barge_in.py)
    # What a fresh worker's first calls would build on the loop (the TLS context, google-genai's
    # transports and their imports): built here, before /readyz says ready.
    await run_in_threadpool(lambda: DurableGeminiLiveLLMService.warm_up(
        **config.gemini_connection()))
    # Keep what startup made (~140,000 objects of pipecat, google-genai, SQLAlchemy) out of
    # the full collections: each otherwise stops every call's audio on this worker for
    # 100-200 ms (docs/operations.md, "Garbage collection").
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        await app.state.leases.stop()
        await app.state.store.close()


app = FastAPI(lifespan=lifespan)


@app.post("/twiml")
async def twiml(request: Request) -> Response:
    asked_at = time.time()  # (a takeover counts the dead worker's audio up to here)
    config: BotConfig = request.app.state.config
    form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
    if config.twilio_auth_token:
        # Twilio signs the URL it requested (the load balancer's), not the one we see.
        url = f"{config.public_url}{request.url.path}"
        if request.url.query:
            url += f"?{request.url.query}"
        signature = request.headers.get("X-Twilio-Signature", "")
        if not RequestValidator(config.twilio_auth_token).validate(url, form, signature):
            return Response("invalid signature", status_code=403)
    call_sid = form.get("CallSid")
    if not call_sid:
        return Response("CallSid missing", status_code=400)
    response = VoiceResponse()
    state = await load_state(request.app.state.store, call_sid)
    if state.closed:  # the log says this call ended: do not open it again
        reason = await close_reason(request.app.state.store, call_sid, state.version)
        verbs_for_closed_call(response, reason, config)
    else:
        connect = Connect()
        stream = connect.stream(url=config.stream_url)
        stream.parameter(name="from_number", value=form.get("From", ""))
        token = await request.app.state.gate.token_for(request.app.state.store, call_sid,
                                                         asked_at)
        if token:
            stream.parameter(name=PARAMETER, value=token)
        response.append(connect)
        # Reached only when the stream closes without the call ending (its worker died).
        response.redirect(f"{config.public_url}/twiml", method="POST")
    return Response(str(response), media_type="application/xml")


@app.websocket("/ws")
async def media_stream(websocket: WebSocket) -> None:
    state = websocket.app.state
    if not state.gate.signed_by_twilio(websocket.headers.get("X-Twilio-Signature")):
        logger.warning(f"refused a media stream from {websocket.client}: no valid "
                       "X-Twilio-Signature on its handshake")
        await websocket.close(code=1008)  # before accept: the upgrade is answered 403
        return
    await websocket.accept()
    _, call_data = await parse_telephony_websocket(websocket)  # (run_call reads it again)
    try:
        admitted = await state.gate.admit(state.store, call_data.call_id or "",
                                          call_data.body.get(PARAMETER))
    except StreamRefused as refused:
        logger.warning(f"refused the media stream of call {call_data.call_id!r} "
                       f"({call_data.stream_id}): {refused.reason}")
        await websocket.close(code=1008, reason=refused.reason[:120])
        return
    await state.leases.hold(call_data.call_id)
    try:
        # The webhook handed this stream out after the call's previous stream (if any) had
        # ended: a takeover counts the dead worker's playback up to then, not to its attach.
        await run_call(websocket, state.config, state.store, state.calls, state.gemini,
                       handed_over_at=admitted.issued_ms / 1000 if admitted else None)
    finally:
        await state.leases.let_go(call_data.call_id)


@app.get("/healthz")
async def healthz() -> dict:
    return {"ok": True, "pid": os.getpid()}


@app.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    calls = len(state.calls)
    try:
        await asyncio.wait_for(state.store.stream_version("readyz-probe"), READY_PROBE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - any failure means: send calls elsewhere
        return JSONResponse({"ready": False, "reason": f"log: {type(exc).__name__}",
                             "calls": calls}, status_code=503)
    if not await state.gemini.reachable():
        return JSONResponse({"ready": False, "reason": "gemini unreachable", "calls": calls},
                            status_code=503)
    if calls >= state.config.max_calls:
        return JSONResponse({"ready": False, "reason": "full", "calls": calls},
                            status_code=503)
    return JSONResponse({"ready": True, "calls": calls, "pid": os.getpid()})


@app.get("/metrics")
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
