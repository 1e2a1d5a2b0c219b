"""The fleet over a time range: calls per hour, takeovers, anomalies, calls in doubt,
and tool wait and result send latency percentiles (`stats`).
"""

from __future__ import annotations


from sqlalchemy import and_, func, select

from ...storage.schema import events, streams
from .base import engine_of, payload_dict
from .listing import is_planned


_HOUR_US = 3600 * 1_000_000


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    xs = sorted(values)

    def q(p: float) -> float:  # nearest rank
        return round(xs[min(len(xs) - 1, max(0, int(-(-len(xs) * p // 100)) - 1))], 3)

    return {"count": len(xs), "p50": q(50), "p90": q(90), "p99": q(99), "max": round(xs[-1], 3)}


async def fleet_stats(store, since_us: int, until_us: int) -> dict:
    """The fleet over calls that started in [since_us, until_us): calls per hour, takeovers
    (crash or planned), anomalies by kind, calls with a tool call in doubt, and percentiles
    of tool wait (requested -> started) and result send (outcome -> write returned)."""
    from ..fmt import iso

    in_range = select(streams.c.stream_id).where(streams.c.created_at_us >= since_us,
                                                 streams.c.created_at_us < until_us)
    hour = streams.c.created_at_us // _HOUR_US
    async with engine_of(store).connect() as conn:
        per_hour = {int(h): int(n) for h, n in await conn.execute(
            select(hour, func.count()).where(streams.c.created_at_us >= since_us,
                                             streams.c.created_at_us < until_us)
            .group_by(hour))}
        planned = crash = 0
        prev = events.alias("prev")
        stmt = (select(events.c.data, prev.c.type, prev.c.data).select_from(events.outerjoin(
            prev, and_(prev.c.stream_id == events.c.stream_id,
                       prev.c.version == events.c.version - 1)))
            .where(events.c.type == "session.worker_attached",
                   events.c.stream_id.in_(in_range)))
        for data, ptype, pdata in await conn.execute(stmt):
            if is_planned(payload_dict(data), ptype, payload_dict(pdata) if pdata else {}):
                planned += 1
            else:
                crash += 1
        kinds: dict[str, int] = {}
        for (data,) in await conn.execute(select(events.c.data).where(
                events.c.type == "anomaly.recorded", events.c.stream_id.in_(in_range))):
            kind = payload_dict(data).get("kind")
            kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        doubt: set[str] = set()
        for sid, etype, data in await conn.execute(select(
                events.c.stream_id, events.c.type, events.c.data).where(
                events.c.type.in_(["tool.call_failed", "tool.call_started",
                                    "tool.outcome_checked"]),
                events.c.stream_id.in_(in_range))):
            d = payload_dict(data)
            if etype == "tool.outcome_checked" or (
                    d.get("outcome_unknown") is True if etype == "tool.call_failed"
                    else isinstance(d.get("attempt"), int) and d["attempt"] > 1):
                doubt.add(sid)
        firsts: dict[tuple[str, str], dict[str, int]] = {}
        tool_types = {"tool.call_requested": "requested", "tool.call_started": "started",
                      "tool.call_completed": "outcome", "tool.call_failed": "outcome",
                      "tool.result_sent": "sent"}
        stmt = (select(events.c.stream_id, events.c.type, events.c.data,
                       events.c.recorded_at_us)
                .where(events.c.type.in_(list(tool_types)), events.c.stream_id.in_(in_range)))
        at: int
        for sid, etype, data, at in await conn.execute(stmt):
            cid = payload_dict(data).get("call_id")
            if not isinstance(cid, str):
                continue
            times = firsts.setdefault((sid, cid), {})
            key = tool_types[etype]
            if key not in times or at < times[key]:
                times[key] = at
    waits = [(t["started"] - t["requested"]) / 1000 for t in firsts.values()
             if "started" in t and "requested" in t]
    sends = [(t["sent"] - t["outcome"]) / 1000 for t in firsts.values()
             if "sent" in t and "outcome" in t and t["sent"] >= t["outcome"]]
    first_hour, last_hour = since_us // _HOUR_US, (until_us - 1) // _HOUR_US
    hours = range(first_hour, last_hour + 1) if last_hour - first_hour <= 24 * 93 else \
        sorted(per_hour)
    return {"since": iso(since_us), "until": iso(until_us),
            "calls": sum(per_hour.values()),
            "calls_per_hour": [{"hour": iso(h * _HOUR_US), "calls": per_hour.get(h, 0)}
                               for h in hours],
            "takeovers": {"crash": crash, "planned": planned},
            "anomalies": {"total": sum(kinds.values()), "by_kind": dict(sorted(kinds.items()))},
            "in_doubt_calls": sorted(doubt),
            "tool_wait_ms": _percentiles(waits), "result_send_ms": _percentiles(sends)}
