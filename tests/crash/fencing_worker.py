"""A live worker process for the fencing test: attaches to a call and keeps appending.

Prints one JSON line per outcome so the test can see exactly what it managed to write.
"""

import asyncio
import json
import sys

from service.driver import CallDriver
from session_store import open_store
from session_store.errors import Fenced
from session_store.events import ConversationMessage


async def main(url: str, schema: str, call_id: str, name: str, count: int) -> None:
    store = await open_store(url, schema=schema)
    driver = CallDriver(store, call_id, worker_id=name)
    await driver.attach(model="m", tools=[], settings={})
    print(json.dumps({"attached": driver.epoch}), flush=True)
    try:
        for i in range(count):
            await driver.record(ConversationMessage("assistant", f"{name} {i}"))
            print(json.dumps({"wrote": i, "version": driver.state.version}), flush=True)
            await asyncio.sleep(0.02)
    except Fenced as exc:
        print(json.dumps({"fenced": str(exc)}), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
