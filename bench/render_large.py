"""What rendering an event costs the support tools when one of its values is huge.

A human line of `tail` or `timeline` shows a preview of each value: its cost must not grow
with what it cannot show. For each size (1 KB baseline, then 1 MB and 10 MB) one event of
each kind is rendered: a transcript (conversation.message) and tool arguments
(tool.call_requested), through the timeline builder and the line `tail` prints (values are
cut before they are redacted and formatted, `audit/fmt.preview_record`); for comparison, the
JSON export line (which must carry the whole value, scrubbed of credentials). Printed: milliseconds per render and the ratio to the 1 KB
baseline of the same path, in the same run.

Reading the row (JSON decoding, done once per event by every reader) is part of every path:
the ratio of the human line to the JSON line says what formatting adds on top.

    python bench/render_large.py
"""

from __future__ import annotations

import json
import time


from session_store import events as ev
from session_store.audit import Redactor, export_line
from session_store.audit.fmt import preview_record
from session_store.audit.text import entry_line
from session_store.audit.timeline import TimelineBuilder
from session_store.events import canonical_json
from session_store.records import GENESIS_HASH, RecordedEvent, chain_hash

SIZES = {"1 KB": 1_000, "1 MB": 1_000_000, "10 MB": 10_000_000}


def record(event: ev.Event, version: int) -> RecordedEvent:
    data = canonical_json(event.to_data())
    at = 1_767_225_600_000_000 + version
    return RecordedEvent("bench", version, version, event.TYPE, event.SCHEMA, data, at,
                         chain_hash(GENESIS_HASH, "bench", version, event.TYPE, event.SCHEMA,
                                    at, data))


def best_ms(fn, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return min(times)


def main() -> None:
    redactor = Redactor()
    opened = record(ev.SessionOpened("m", ["t"], "w", 1), 1)
    results: dict[tuple[str, str, str], float] = {}
    for label, size in SIZES.items():
        text = "x" * size
        for kind, event in (("transcript", ev.ConversationMessage("user", text, 1)),
                            ("arguments", ev.ToolCallRequested("c1", "t", {"note": text}, 1))):
            rec = record(event, 2)

            def human():
                b = TimelineBuilder("bench", None)
                b.add(opened)
                line = entry_line(b.add(redactor.redact_record(preview_record(rec))), "bench")
                assert len(line) < 1000

            def as_json():
                json.dumps(export_line(rec, redactor), ensure_ascii=False)

            results[(kind, "human line", label)] = best_ms(human)
            results[(kind, "JSON line", label)] = best_ms(as_json)
    print(f"{'value':<11} {'path':<11} " + " ".join(f"{s:>18}" for s in SIZES))
    for kind in ("transcript", "arguments"):
        for path in ("human line", "JSON line"):
            base = results[(kind, path, "1 KB")]
            cells = [f"{results[(kind, path, s)]:9.1f} ms {results[(kind, path, s)] / base:5.0f}x"
                     for s in SIZES]
            print(f"{kind:<11} {path:<11} " + " ".join(f"{c:>18}" for c in cells))
    for kind in ("transcript", "arguments"):
        h, j = results[(kind, "human line", "10 MB")], results[(kind, "JSON line", "10 MB")]
        print(f"{kind}, 10 MB: the human line costs {h / j:.2f}x the JSON line")


if __name__ == "__main__":
    main()
