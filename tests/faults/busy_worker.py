"""The old worker of a takeover under load: it opens the call, then records messages as fast
as it can until a newer worker fences it. One JSON line per milestone, for the test (and
bench/takeover.py) to judge: {"opened": version}, {"busy": appends} once it has made
`warm_up` appends (the takeover may start), then {"fenced": appends acknowledged} or
{"error": ...}."""

import asyncio
import json
import sys
import time

from service.driver import CallDriver
from session_store import open_store
from session_store.errors import Fenced
from session_store.events import ConversationMessage


def say(**what) -> None:
    print(json.dumps(what), flush=True)


async def main(url: str, schema: str, call_id: str, inline: str, warm_up: str) -> None:
    options = {"schema": schema} if schema else {"inline": inline}
    store = await open_store(url, **options)
    try:
        driver = CallDriver(store, call_id, worker_id="old")
        await driver.attach(model="m", tools=[], settings={})
        say(opened=driver.state.version)
        acknowledged, began = 0, time.monotonic()
        try:
            while True:
                await driver.record(ConversationMessage("user", f"old {acknowledged}", 1))
                acknowledged += 1
                if acknowledged == int(warm_up):
                    say(busy=acknowledged, per_s=acknowledged / (time.monotonic() - began))
        except Fenced:
            say(fenced=acknowledged, per_s=acknowledged / (time.monotonic() - began))
        except Exception as exc:  # noqa: BLE001 - judged by the test
            say(error=f"{type(exc).__name__}: {exc}", acknowledged=acknowledged)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
