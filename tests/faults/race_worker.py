"""One worker process of the takeover race: on "go" it takes the call over, on "record" it
appends one message; each outcome is printed as one JSON line for the test to judge."""

import asyncio
import json
import sys

from service.driver import CallDriver
from session_store import open_store
from session_store.errors import Fenced
from session_store.events import ConversationMessage


def say(**what) -> None:
    print(json.dumps(what), flush=True)


async def main(url: str, schema: str, call_id: str, name: str) -> None:
    store = await open_store(url, **({"schema": schema} if schema else {}))
    loop = asyncio.get_running_loop()
    try:
        driver = CallDriver(store, call_id, worker_id=name)
        say(ready=name)
        await loop.run_in_executor(None, sys.stdin.readline)  # "go": all start together
        try:
            await driver.attach(model="m", tools=[], settings={})
            say(attached=driver.epoch)
        except Exception as exc:  # noqa: BLE001 - judged by the test
            say(error=f"{type(exc).__name__}: {exc}")
            return
        await loop.run_in_executor(None, sys.stdin.readline)  # "record"
        try:
            await driver.record(ConversationMessage("user", f"from {name}", 1))
            say(recorded=driver.state.version)
        except Fenced:
            say(fenced=driver.epoch)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
