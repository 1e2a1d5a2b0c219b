"""The call list page and its API: filtered, sorted, paged."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from ..audit import CallFilter, parse_time
from ..audit.queries import count_calls, list_calls
from ..audit.summaries import SORTS, STATUSES, parse_duration
from .params import BadRequest, int_param
from .security import SECURITY_HEADERS, JSONResponse
from .viewer import Viewer


class CallList:
    """The call list: `/` and `/api/calls`."""

    def __init__(self, viewer: Viewer) -> None:
        self.viewer = viewer

    def _filter(self, request: Request) -> CallFilter:
        qp = request.query_params
        status = qp.get("status") or None
        if status is not None and status not in STATUSES:
            raise BadRequest(f"status must be one of {', '.join(STATUSES)}")
        try:
            return CallFilter(parse_time(qp.get("since")), parse_time(qp.get("until")), status,
                              qp.get("q") or None, qp.get("after") or None,
                              int_param(request, "limit", 50, 1, 500),
                              text=qp.get("text") or None, tool=qp.get("tool") or None,
                              failed=qp.get("failed") == "1",
                              takeover=qp.get("takeover") == "1",
                              anomaly=qp.get("anomaly") == "1",
                              min_duration_s=parse_duration(qp.get("min_duration")),
                              max_duration_s=parse_duration(qp.get("max_duration")),
                              sort=qp.get("sort") or "newest")
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    async def _list_calls(self, flt: CallFilter, now_us: int):
        try:
            return await list_calls(self.viewer.store, flt, now_us)
        except ValueError as exc:  # `after` names no call
            raise BadRequest(str(exc)) from None

    async def calls_page(self, request: Request) -> Response:
        flt = self._filter(request)
        now = time.time_ns() // 1000
        page = await self._list_calls(flt, now)
        total = await count_calls(self.viewer.store, flt.counted(), now)
        params = {k: v for k, v in request.query_params.items() if k not in ("after", "token")}
        return self.viewer.page("calls.html", calls=page.calls, total=total, flt=flt,
                         q=request.query_params, statuses=STATUSES, sorts=list(SORTS),
                         redact=self.viewer.redacting(request),
                         next_href=("?" + urlencode({**params, "after": page.next_after})
                                    if page.next_after else None))

    async def calls_api(self, request: Request) -> Response:
        page = await self._list_calls(self._filter(request), time.time_ns() // 1000)
        return JSONResponse(page.to_json(), headers=SECURITY_HEADERS)
