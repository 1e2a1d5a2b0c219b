"""What the fleet's /metrics must read (examples/phone_bot/fleet_metrics.py collects them):
zero before any call; after, on every worker still alive, each counter equal to what its
log says, no call left, and the takeovers equal to the calls the kill moved."""

from __future__ import annotations

from examples.phone_bot.fleet_metrics import FROM_LOG

#: Every metric of service/metrics.py, as fleet_metrics.samples names a sample of it.
EVERY = (*FROM_LOG, "live_calls", "calls_ended_total{reason=taken_over}",
         "calls_ended_total{reason=stopped}", "fencing_refusals_total",
         "append_seconds_count", "commit_batch_events_count", "event_loop_lag_seconds_count")


def problems(summary: dict) -> list[str]:
    found: list[str] = []
    taken_over = 0
    for index, worker in summary["metrics"].items():
        before, after, expected = worker["before"], worker["after"], worker["expected"]
        who = f"worker #{index} (pid {worker['pid']})"
        missing = [name for name in EVERY if name not in before]
        if missing:
            found.append(f"{who}: not exposed: {missing}")
            continue
        moved = {name: before[name] for name in EVERY if before[name]}
        if moved:
            found.append(f"{who}: not zero before any call: {moved}")
        if after is None:
            continue  # the killed worker
        differ = {name: (after[name], expected[name]) for name in FROM_LOG
                  if after[name] != expected[name]}
        if differ:
            found.append(f"{who}: metric != its log (metric, log): {differ}")
        if after["live_calls"] != 0:
            found.append(f"{who}: {after['live_calls']} calls still live after every call ended")
        for reason in ("taken_over", "stopped"):
            if after[f"calls_ended_total{{reason={reason}}}"]:
                found.append(f"{who}: calls ended by {reason} where every call was hung up")
        served = after["calls_started_total"] + after["calls_taken_over_total"]
        if served and not after["event_loop_lag_seconds_count"]:
            found.append(f"{who}: served {served:.0f} calls and never probed its loop")
        if not after["commit_batch_events_count"] <= after["append_seconds_count"]:
            found.append(f"{who}: more commits than appends")
        if after["fencing_refusals_total"]:
            found.append(f"{who}: fenced out of a call, where only a dead worker was")
        taken_over += after["calls_taken_over_total"]
    # A moved call the dead worker had logged nothing of is opened by the next one, not
    # taken over (a kill at a call's first moments; the fleet's verdict accepts it).
    afresh = len(summary.get("opened_afresh", []))
    moved = len(summary["affected"]) - afresh
    if taken_over != moved:
        found.append(f"the kill moved {moved} calls it had logged (and {afresh} it had not); "
                     f"the workers alive took over {taken_over}")
    return found
