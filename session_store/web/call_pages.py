"""One call: its page (`/calls/ID`: timeline window, swimlanes, overview), the timeline,
state and replay APIs, live updates of an open call (server-sent events over the store's
subscribe) and its export as JSON Lines.
"""

from __future__ import annotations

import asyncio
import re
import time

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..audit import build_timeline, export_line, parse_policy, replay, state_view
from ..audit.fmt import clip_strings, iso, preview_record
from ..audit.jsontext import dumps
from ..audit.models import LiveUpdate, State, dump, entry_json
from ..audit.queries import (
    StateCache, call_summary, complete_head, follow, iter_records, overview, read_previews,
    state_at, state_of_read, window_facts,
)
from ..audit.summaries import status_of
from ..audit.timeline import Prior, TimelineBuilder, tool_calls_in, unreadable_call
from ..projection import fold_into
from ..storage.schema import valid_stream_id
from .params import call_id_of, float_param, href, int_param, point_param
from .security import SECURITY_HEADERS, JSONResponse
from .svg import lanes_svg, overview_svg
from .viewer import Viewer

#: Strings longer than this are cut in the state inspector's JSON (?full=1 for all).
INSPECTOR_STRING_MAX = 2000
#: The inspector folds previews this long: redaction sees a secret that crosses the cut
#: whole, as in the whole value, before the cut.
INSPECTOR_PREVIEW = 2 * INSPECTOR_STRING_MAX


class CallPages:
    """One call: its page, timeline, state, replay, live updates and export."""

    def __init__(self, viewer: Viewer) -> None:
        self.viewer = viewer
        self.inspector_cache = StateCache(previews=True, preview_limit=INSPECTOR_PREVIEW)

    async def _window(self, request: Request, call_id: str, previews: bool = False):
        """The call's summary and timeline of the window asked for: `at` (the window holding
        that version), else `from`, else the start (a closed call) or the newest events (an
        open one). Facts are the whole call's."""
        head = await complete_head(self.viewer.store, call_id)  # damaged: StreamDamaged, a 500
        if not head:
            return None
        summary = await call_summary(self.viewer.store, call_id, time.time_ns() // 1000)
        if summary is None:
            return None
        n = int_param(request, "n", self.viewer.page_size, 1, 5000)
        at = await point_param(request, "at", self.viewer.store, call_id, head)
        if at is not None:
            first = (at - 1) // n * n + 1
        elif request.query_params.get("from"):
            first = int_param(request, "from", 1, 1, head)
        else:
            first = 1 if summary.closed or head <= n else head - n + 1
        last = min(head, first + n - 1)
        store = self.viewer.store
        # The page shows previews: the window and its states are read as previews, a chunk
        # at a time (a window of 10 MB events was held whole, and the call's whole state).
        recs = (await read_previews(store, call_id, first, last) if previews
                else await store.read(call_id, from_version=first, to_version=last))
        prior, whole, note = await window_facts(
            store, call_id, first, last, head, self.viewer.cache_for(previews),
            tool_calls_in(recs), previews=previews)
        redactor = self.viewer.redactor(request)
        tl = build_timeline(redactor.redact_records(recs), call_id=call_id,
                            t0_us=summary.started_at_us, prior=prior, whole=whole,
                            redact_state=redactor.redact_state)
        if note is not None:
            tl.problems.insert(0, unreadable_call(first, redactor.scrub_text(note)))
        return summary, tl, first, n, at

    async def call_page(self, request: Request) -> Response:
        call_id = call_id_of(request)
        found = await self._window(request, call_id, previews=True) if valid_stream_id(call_id) \
            else None
        if found is None:
            return self.viewer.not_found(request, call_id, api=False)
        summary, tl, first, n, at = found
        ov = await overview(self.viewer.store, call_id, summary.started_at_us,
                            summary.last_event_at_us)
        redact = self.viewer.redacting(request)
        zoom = float_param(request, "zoom", 1.0, 1.0, 64.0)
        keep = {"n": n, **({"redact": "1"} if redact and not self.viewer.forced else {}),
                **({"zoom": f"{zoom:g}"} if zoom != 1 else {})}
        head = summary.events
        nav = {"first": 1 if first > 1 else None,
               "prev": max(1, first - n) if first > 1 else None,
               "next": first + n if first + n <= head else None,
               "last": max(1, head - n + 1) if first + n <= head else None}
        def page(**params) -> str:
            return href("calls", call_id, **{**keep, **params})

        ctx = dict(s=summary, tl=tl, first=first, n=n, keep=keep, at=at, zoom=zoom,
                   nav={k: page(**{"from": v}) for k, v in nav.items() if v},
                   lanes=lanes_svg(tl, zoom), redact=redact, forced=self.viewer.forced,
                   overview=overview_svg(ov, (tl.start_us, tl.end_us) if tl.start_us else None,
                                         lambda v: page(at=v)),
                   tool_calls=list(tl.tool_calls.values()), page=page,
                   now_us=time.time_ns() // 1000,
                   follows_head=tl.last_version == head and not summary.closed,
                   zoom_in=page(zoom=f"{min(zoom * 2, 64):g}", **{"from": first}),
                   zoom_out=page(zoom=f"{max(zoom / 2, 1):g}", **{"from": first}))
        if request.query_params.get("part") == "live":
            return self.viewer.page("call_live.html", **ctx)
        return self.viewer.page("call.html", **ctx)

    async def timeline_api(self, request: Request) -> Response:
        call_id = call_id_of(request)
        # Values cut to previews as on the page, unless ?full=1 (as in the state inspector).
        previews = request.query_params.get("full") != "1"
        found = await self._window(request, call_id, previews) if valid_stream_id(call_id) \
            else None
        if found is None:
            return self.viewer.not_found(request, call_id, api=True)
        summary, tl, *_ = found
        return JSONResponse(tl.to_json(summary), headers=SECURITY_HEADERS)

    async def state_api(self, request: Request) -> Response:
        call_id = call_id_of(request)
        found = await complete_head(self.viewer.store, call_id) if valid_stream_id(call_id) else 0
        at = await point_param(request, "at", self.viewer.store, call_id, found) if found else None
        full = request.query_params.get("full") == "1"
        # What it shows is cut (unless ?full=1): a fold of previews, and the event's preview
        # (the whole state, every value scrubbed, took 11 s and 360 MB on a 100 MB call).
        s = None if not found else (
            await state_at(self.viewer.store, call_id, at, self.viewer.cache) if full else
            await state_at(self.viewer.store, call_id, at, self.inspector_cache,
                           previews=True, preview_limit=INSPECTOR_PREVIEW))
        if s is None:
            return self.viewer.not_found(request, call_id, api=True)
        redactor = self.viewer.redactor(request)
        event = None
        if s.version:
            rec = (await self.viewer.store.read(call_id, from_version=s.version,
                                         to_version=s.version))
            if rec:
                event = export_line(rec[0] if full else preview_record(
                    rec[0], INSPECTOR_PREVIEW), redactor)
        view = {**redactor.redact_state(state_view(s, call_id, max_items=100)), "event": event}
        if not full:
            view = clip_strings(view, INSPECTOR_STRING_MAX)
        return JSONResponse(dump(State, view), headers=SECURITY_HEADERS)

    async def replay_api(self, request: Request) -> Response:
        call_id = call_id_of(request)
        head = await complete_head(self.viewer.store, call_id) if valid_stream_id(call_id) else 0
        if head == 0:
            return self.viewer.not_found(request, call_id, api=True)
        qp = request.query_params
        policy = parse_policy(qp.get("defer", "all"), qp.get("idempotent", ""),
                              qp.get("reuse", "all"))
        recs = await self.viewer.store.read(call_id, to_version=head)
        report = await asyncio.to_thread(replay, recs, policy, call_id=call_id)
        return JSONResponse(report.redacted(self.viewer.redactor(request)).to_json(),
                            headers=SECURITY_HEADERS)

    async def live(self, request: Request) -> Response:
        """Server-sent events: one `update` per new event of the call (models.LiveUpdate),
        from the store's subscribe; the stream ends when the call closes."""
        from sse_starlette.sse import EventSourceResponse

        call_id = call_id_of(request)
        head = await complete_head(self.viewer.store, call_id) if valid_stream_id(call_id) else 0
        if head == 0:
            return self.viewer.not_found(request, call_id, api=True)
        after = int_param(request, "after", head, 1, head)
        redactor = self.viewer.redactor(request)
        # (held while the client follows, and its entries are previews: a fold of previews)
        state = await state_of_read(self.viewer.store, call_id, after,
                                    self.viewer.cache_for(previews=True), previews=True)
        start = preview_record((await self.viewer.store.read(call_id, from_version=after,
                                                             to_version=after))[0])
        first = await self.viewer.store.read(call_id, to_version=1)
        builder = TimelineBuilder(call_id, first[0].recorded_at_us, Prior(state, start))

        def update(entries) -> str:
            status = status_of(state.closed, state.last_event_at_us, time.time_ns() // 1000)
            return dumps(dump(LiveUpdate, {
                "call": call_id, "head": state.version, "status": status,
                "last_event_at": iso(state.last_event_at_us),
                "entries": [entry_json(e) for e in entries]}))

        async def events():
            yield {"event": "update", "data": update([])}
            if state.closed:
                return
            async for rec in follow(self.viewer.store, start, call_id):
                rec = preview_record(rec)
                fold_into(state, [rec])
                entry = builder.add(redactor.redact_record(rec))
                builder.tl.entries.clear()
                yield {"event": "update", "data": update([entry])}
                if state.closed:
                    return

        return EventSourceResponse(events(), ping=15, headers=SECURITY_HEADERS,
                                   shutdown_event=self.viewer.stopping)

    async def export(self, request: Request) -> Response:
        call_id = call_id_of(request)
        # Checked before the first byte goes out (a status cannot change mid-stream): a call
        # with events missing is refused with the reason, not exported as if it were whole.
        head = await complete_head(self.viewer.store, call_id) if valid_stream_id(call_id) else 0
        if head == 0:
            return self.viewer.not_found(request, call_id, api=True)
        redactor = self.viewer.redactor(request)

        async def lines():
            async for chunk in iter_records(self.viewer.store, call_id, to_version=head):
                yield "".join(dumps(export_line(r, redactor), sort_keys=True) + "\n"
                              for r in chunk)

        name = re.sub(r"[^A-Za-z0-9._-]", "_", call_id)[:80] or "call"
        suffix = ".redacted" if redactor.enabled else ""
        return StreamingResponse(lines(), media_type="application/x-ndjson", headers={
            **SECURITY_HEADERS,
            "content-disposition": f'attachment; filename="{name}{suffix}.jsonl"'})
