"""One phone call: pipecat's websocket transport with the Twilio serializer, and a durable
Gemini Live service whose call id is Twilio's CallSid.

The same code runs a new call and takes over a call another worker was serving when it
died: the service finds the CallSid's log, attaches with a new fencing epoch and goes on
from where the log says the call is. Nothing here is crash-specific.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import WebSocket
from loguru import logger
from pipecat.audio.vad.vad_analyzer import VADAnalyzer
from pipecat.frames.frames import EndFrame, LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.workers.runner import WorkerRunner
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (LLMContextAggregatorPair,
                                                                   LLMUserAggregatorParams)
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import (FastAPIWebsocketParams,
                                                  FastAPIWebsocketTransport)

from service.gemini_live import PLAYBACK_LEAD_S, DurableGeminiLiveLLMService
from session_store import Policy

from .barge_in import SharedModelSileroVAD, barge_in_strategies, load_vad_model
from .call_end import END_CALL_ON_GIVE_UP, end_calls_that_cannot_go_on
from .config import BotConfig
from .pacing import LeadPacedWebsocketTransport
from .playback import PlaybackMarks
from .resampling import IntegerRatioResampler
from .tools import IDEMPOTENT, TOOLS, Ledger, register_tools

PROMPT = ("You are the phone assistant of an online shop. Be brief and friendly. Refund "
          "orders the caller asks about with refund_order, then mail the receipt with "
          "send_receipt. The caller's number is {caller}.")
OPENING = "A caller has just been connected. Greet them."

# No RTVI (a phone has no RTVI client: the serializer drops its messages) and no turn
# tracking (only tracing reads it): pipecat hands every frame's push and processing to each
# observer through a queue and a task of its own, ~10 % of a worker's CPU (bench/README.md).
WORKER_OPTIONS = {"enable_rtvi": False, "enable_turn_tracking": False}


class CallerAwareTwilioSerializer(TwilioFrameSerializer):
    """Twilio's serializer that also notes the `stop` message: Twilio sends it when the
    caller hangs up. A stream that closes without it did not end the call (this worker's
    connection was cut): the call must stay open for the worker the redirect reaches."""

    hung_up = False
    playback: PlaybackMarks | None = None  # told of each `mark` Twilio echoes

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Chunk for chunk, not in soxr's blocks: each turn's first audio 80-120 ms sooner
        # (resampling.py). (pipecat's attributes: test_resampling.py fails if they move.)
        self._output_resampler = IntegerRatioResampler()
        self._input_resampler = IntegerRatioResampler()

    async def deserialize(self, data):
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        if '"stop"' in text or '"mark"' in text:
            try:
                message = json.loads(text)
            except ValueError:
                message = {}
            event = message.get("event")
            self.hung_up = self.hung_up or event == "stop"
            if event == "mark" and self.playback is not None:
                self.playback.played(str((message.get("mark") or {}).get("name", "")))
        return await super().deserialize(data)


def user_params(vad: VADAnalyzer, talked_over: Callable[[], bool]) -> LLMUserAggregatorParams:
    """Gemini Live detects the caller's turns itself (server-side VAD, `interrupted` on a
    barge-in during a generation). The local VAD only stops the bot's audio still playing
    after the model's turn ended (barge_in.py). pipecat's default strategies would also load
    the smart-turn ONNX model for every call (~45 ms of blocked event loop, a gap in every
    other call's audio) that this pipeline never runs."""
    return LLMUserAggregatorParams(vad_analyzer=vad,
                                   user_turn_strategies=barge_in_strategies(talked_over))


async def run_call(websocket: WebSocket, config: BotConfig, store, calls: dict,
                   gemini_reach=None, handed_over_at: float | None = None) -> None:
    """Serve one Media Streams websocket (already accepted) until it ends. `handed_over_at`:
    when the webhook handed this stream out (Unix seconds), if known."""
    _, call_data = await parse_telephony_websocket(websocket)
    call_sid = call_data.call_id
    if not call_sid:
        await websocket.close(code=1008, reason="no callSid in the stream's start message")
        return
    serializer = CallerAwareTwilioSerializer(
        stream_sid=call_data.stream_id, call_sid=call_sid,
        # Off: it hangs up on CancelFrame too, and a worker shutting down cancels its
        # pipelines; the call must outlive this worker. Hang up deliberately instead.
        params=TwilioFrameSerializer.InputParams(auto_hang_up=False))
    params = FastAPIWebsocketParams(audio_in_enabled=True, audio_out_enabled=True,
                                    add_wav_header=False, serializer=serializer)
    transport = (FastAPIWebsocketTransport(websocket, params) if config.audio_lead_s is None
                 else LeadPacedWebsocketTransport(websocket, params, lead_s=config.audio_lead_s))
    llm = DurableGeminiLiveLLMService(
        api_key=config.google_api_key,
        settings=DurableGeminiLiveLLMService.Settings(
            model=config.model, system_instruction=PROMPT.format(caller=call_data.from_number)),
        tools=TOOLS,
        store=store, call_id=call_sid,  # an open call with this id is taken over
        policy=Policy(idempotent=IDEMPOTENT, end_call_on_give_up=END_CALL_ON_GIVE_UP),
        reconnect_window_s=config.gemini_give_up_s,
        # Written ahead of real time: the pacing's lead, on top of pipecat's chunk.
        playback_lead_s=PLAYBACK_LEAD_S + (config.audio_lead_s or 0.0),
        handed_over_at=handed_over_at,
        **config.gemini_connection())
    register_tools(llm, Ledger(config.ledger_path), latency_s=config.tool_latency_s)

    context = LLMContext(messages=[{"role": "user", "content": OPENING}])
    # Marks after the bot's audio: a turn the caller interrupts is logged as far as heard.
    marks = serializer.playback = llm.playback = PlaybackMarks(call_data.stream_id)
    def talked_over() -> bool:
        return marks.playing() and not llm.speech.model_generating

    aggregators = LLMContextAggregatorPair(context, user_params=user_params(
        SharedModelSileroVAD(await load_vad_model(), listening=talked_over),
        talked_over=talked_over))
    pipeline = Pipeline([transport.input(), aggregators.user(), llm, marks, transport.output(),
                         aggregators.assistant()])
    task = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=16000,
                                                        audio_out_sample_rate=24000),
                          **WORKER_OPTIONS)

    @transport.event_handler("on_client_connected")
    async def on_client_connected(transport, client):
        # A new call greets; a taken-over one is seeded from its log (or resumed) instead.
        await task.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(transport, client):
        if serializer.hung_up:
            await task.queue_frame(EndFrame())  # the call is over: logged as ended
        else:
            await task.cancel()  # left open: the provider's redirect brings it back

    if gemini_reach is not None:
        end_calls_that_cannot_go_on(llm, websocket, task, gemini_reach)
    calls[call_sid] = task
    logger.info(f"call {call_sid} on stream {call_data.stream_id}")
    try:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(task)
        await runner.run()
    finally:
        if calls.get(call_sid) is task:
            del calls[call_sid]
