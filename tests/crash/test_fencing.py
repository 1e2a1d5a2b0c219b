"""I6 with two live processes on PostgreSQL: after a takeover the old worker cannot append."""

import asyncio
import json
import sys
import uuid
from pathlib import Path

import pytest

from session_store import load_state
from session_store.events import ConversationMessage

WORKER = Path(__file__).with_name("fencing_worker.py")


async def _spawn(backend, call_id, name, count):
    return await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), backend.url, backend.options["schema"], call_id, name,
        str(count), stdout=asyncio.subprocess.PIPE, cwd=str(WORKER.parents[2]))


async def _lines(proc):
    out = []
    while line := await proc.stdout.readline():
        out.append(json.loads(line))
    await proc.wait()
    return out


@pytest.mark.timeout(60)
async def test_old_worker_is_fenced_after_takeover(backend, store):
    if backend.name != "postgres":
        pytest.skip("the multi-worker path is PostgreSQL's")
    call_id = f"fence-{uuid.uuid4().hex[:6]}"
    old = await _spawn(backend, call_id, "old", 400)
    # Let the old worker get going, then start the new one while it is still writing.
    first = json.loads(await old.stdout.readline())
    assert first == {"attached": 1}
    while (await store.stream_version(call_id)) < 5:
        await asyncio.sleep(0.02)
    new = await _spawn(backend, call_id, "new", 10)
    old_lines, new_lines = await asyncio.gather(_lines(old), _lines(new))

    assert new_lines[0] == {"attached": 2}
    assert any("fenced" in line for line in old_lines), "the old worker was never stopped"
    assert not any("fenced" in line for line in new_lines)
    records = await store.read(call_id)
    takeover = next(r.version for r in records if r.type == "session.worker_attached")
    after = [r.event.text for r in records[takeover:] if r.type == "conversation.message"]
    assert after and all(text.startswith("new ") for text in after), \
        "an event of the old worker landed after the takeover"
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    state = await load_state(store, call_id)
    assert state.epoch == 2 and state.takeovers == 1


async def test_fenced_append_is_rejected_even_at_the_right_version(store):
    call_id = "fence-unit"
    v = await store.append(call_id, [ConversationMessage("user", "a")], 0, epoch=1)
    v = await store.append(call_id, [ConversationMessage("user", "b")], v, epoch=2)
    from session_store.errors import Fenced
    with pytest.raises(Fenced):
        await store.append(call_id, [ConversationMessage("user", "c")], v, epoch=1)
