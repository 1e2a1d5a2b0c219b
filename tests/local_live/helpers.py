"""What the local server's tests share: reading a google-genai Live session."""

from __future__ import annotations

import asyncio
from typing import Callable

from google.genai import types


async def receive_until(
    session, done: Callable[[types.LiveServerMessage], bool], timeout: float = 5.0
) -> list[types.LiveServerMessage]:
    """Messages up to and including the first one ``done`` accepts.

    ``session.receive()`` stops after each turnComplete, so it is restarted as needed.
    """
    messages: list[types.LiveServerMessage] = []

    async def read() -> None:
        while True:
            async for message in session.receive():
                messages.append(message)
                if done(message):
                    return

    await asyncio.wait_for(read(), timeout)
    return messages


def turn_complete(message: types.LiveServerMessage) -> bool:
    return bool(message.server_content and message.server_content.turn_complete)
