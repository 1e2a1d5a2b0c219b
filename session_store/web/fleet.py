"""The fleet page and its API: calls per hour, takeovers, anomalies, latencies."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from ..audit import parse_time
from ..audit.models import Stats, dump
from ..audit.queries import fleet_stats
from .params import BadRequest
from .security import SECURITY_HEADERS, JSONResponse
from .svg import per_hour_svg
from .viewer import Viewer


class FleetPage:
    """The fleet page: `/fleet` and `/api/stats`."""

    def __init__(self, viewer: Viewer) -> None:
        self.viewer = viewer

    async def _stats(self, request: Request) -> dict:
        try:
            since = parse_time(request.query_params.get("since") or "24h")
            until = parse_time(request.query_params.get("until")) or time.time_ns() // 1000
            if since is None:  # ("24h" when not given)
                raise ValueError("since: a time or an age is needed")
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if since >= until:
            raise BadRequest("since must be before until")
        return dump(Stats, await fleet_stats(self.viewer.store, since, until))

    async def fleet_page(self, request: Request) -> Response:
        stats = await self._stats(request)
        return self.viewer.page("fleet.html", st=stats, q=request.query_params,
                         chart=per_hour_svg(stats["calls_per_hour"]),
                         redact=self.viewer.redacting(request))

    async def stats_api(self, request: Request) -> Response:
        return JSONResponse(await self._stats(request), headers=SECURITY_HEADERS)
