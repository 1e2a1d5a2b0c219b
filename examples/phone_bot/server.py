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
- `GET /readyz`  it can take a call: the log answers and it is below MAX_CALLS.
- `GET /metrics` Prometheus metrics (docs/metrics.md): keep it off the public address.
"""

from __future__ import annotations

import asyncio
import gc
import os
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from twilio.request_validator import RequestValidator
from twilio.twiml.voice_response import Connect, VoiceResponse

from service import metrics
from session_store import load_state, open_store

from .bot import run_call
from .config import BotConfig

READY_PROBE_TIMEOUT_S = 2.0


@asynccontextmanager
async def lifespan(app: FastAPI):
    config = BotConfig.from_env()
    app.state.config = config
    app.state.store = await open_store(config.database_url, **config.store_options())
    app.state.calls = {}
    metrics.install()
    # Keep what startup made (~140,000 objects of pipecat, google-genai, SQLAlchemy) out of
    # the full collections: each otherwise stops every call's audio on this worker for
    # 100-200 ms (docs/operations.md, "Garbage collection").
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        await app.state.store.close()


app = FastAPI(lifespan=lifespan)


@app.post("/twiml")
async def twiml(request: Request) -> Response:
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
    if (await load_state(request.app.state.store, call_sid)).closed:
        response.hangup()  # the log says this call ended: do not open it again
    else:
        connect = Connect()
        stream = connect.stream(url=config.stream_url)
        stream.parameter(name="from_number", value=form.get("From", ""))
        response.append(connect)
        # Reached only when the stream closes without the call ending (its worker died).
        response.redirect(f"{config.public_url}/twiml", method="POST")
    return Response(str(response), media_type="application/xml")


@app.websocket("/ws")
async def media_stream(websocket: WebSocket) -> None:
    await websocket.accept()
    state = websocket.app.state
    await run_call(websocket, state.config, state.store, state.calls)


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
    if calls >= state.config.max_calls:
        return JSONResponse({"ready": False, "reason": "full", "calls": calls},
                            status_code=503)
    return JSONResponse({"ready": True, "calls": calls, "pid": os.getpid()})


@app.get("/metrics")
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
