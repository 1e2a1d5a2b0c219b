"""The fleet's load balancer (telephony.Balancer) when a worker dies during a stream's
handshake: the request goes to another worker, as nginx's default `proxy_next_upstream
error timeout` does. An answer (a refusal) is final. (Seen in a fleet run: a call whose
first stream reached the worker being killed was lost by the stand-in, not by the bot.)"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from examples.phone_bot.telephony import Balancer, PhoneCall

PUBLIC = "https://bot.example.com"


@contextlib.asynccontextmanager
async def dies_during_handshakes():
    """A worker that reads the upgrade request and drops the connection unanswered."""
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def takes_a_stream(seen: list[dict]):
    """A worker that reads the stream's `start` and then ends the stream (closes)."""
    async def serve(websocket) -> None:
        async for message in websocket:
            event = json.loads(message)
            if event.get("event") == "start":
                seen.append(event)
                await websocket.close()

    async with websockets.serve(serve, "127.0.0.1", 0) as server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def refuses_streams():
    async def refuse(connection, request):
        return connection.respond(403, "refused\n")

    async with websockets.serve(lambda ws: ws.close(), "127.0.0.1", 0,
                                process_request=refuse) as server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_stream_whose_worker_dies_in_the_handshake_goes_to_another():
    seen: list[dict] = []
    async with dies_during_handshakes() as dying, takes_a_stream(seen) as alive:
        balancer = Balancer(PUBLIC, [dying, alive])
        balancer.open_streams[alive] = 1  # least connections: the dying one is picked first
        call = PhoneCall(balancer, f"{PUBLIC}/twiml", "+15550001234")
        await asyncio.wait_for(call._stream("wss://bot.example.com/ws", {"k": "v"}), 10)
    assert [s.worker for s in call.streams] == [alive]
    assert seen[0]["start"]["callSid"] == call.call_sid
    assert seen[0]["start"]["customParameters"] == {"k": "v"}  # the same request, resent
    assert balancer._up() == [alive]  # the dropped one is left out for a while


async def test_a_refused_stream_is_not_sent_elsewhere():
    seen: list[dict] = []
    async with refuses_streams() as refusing, takes_a_stream(seen) as alive:
        balancer = Balancer(PUBLIC, [refusing, alive])
        balancer.open_streams[alive] = 1
        call = PhoneCall(balancer, f"{PUBLIC}/twiml", "+15550001234")
        with pytest.raises(InvalidStatus):
            await asyncio.wait_for(call._stream("wss://bot.example.com/ws", {}), 10)
    assert call.streams == [] and seen == []
