"""Calls whose worker is gone go back to the fleet through Twilio's REST API.

The TwiML's `<Redirect>` after `<Connect><Stream>` brings a call back when its stream
closes, but Twilio documents that only for a close by the server; after an abrupt one (a
dead worker: error 31903) what it does is undocumented. So every worker also keeps a lease
on each call it serves, renewed every CALL_LEASE_S / 5, in a small table of its own next to
the log (`phone_bot_leases`). Every worker sweeps the table: a call whose lease expired,
whose log says it is open, and whose worker has not been replaced, is claimed (a conditional
update of its lease row, then an `anomaly.recorded` "worker_gone" appended to the call's log
at the version read: two live workers never both win) and redirected once per lost worker
by updating the live call with the webhook's URL (POST /2010-04-01/Accounts/{sid}/Calls/
{CallSid}.json, Url=…/twiml, documented), through the `twilio` library's client. If
Twilio answers that the call is over (21220: the caller hung up as its worker died, before
the worker logged the end), the call is closed in its log instead (`session.closed`,
"ended", after an `ended_while_worker_gone` anomaly).

Needs TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN (the token is never logged);
TWILIO_API_BASE_URL points the client at a stand-in.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from loguru import logger
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, delete, func, insert, \
    select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import CreateTable
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from session_store import events as ev
from session_store.errors import ConcurrencyConflict, Fenced

from .config import BotConfig

GONE = "worker_gone"
ENDED_WHILE_GONE = "ended_while_worker_gone"
#: Twilio's error for updating a call that is no longer in progress.
CALL_OVER = 21220
_LEASES_DDL_LOCK = 0x70686F6E  # PostgreSQL advisory lock key: creating phone_bot_leases
_metadata = MetaData()
leases = Table(
    "phone_bot_leases", _metadata,
    Column("call_sid", String(64), primary_key=True),
    Column("worker", String(200), nullable=True),  # NULL: its stream ended, no one serves it
    Column("expires_at", Float, nullable=False),
    Column("redirected_epoch", Integer, nullable=True))  # the lost worker's epoch, once redirected


@dataclass(frozen=True)
class Rescue:
    """A redirect due: the log is at `version`, the lost worker held `epoch` (0: the call
    has no log yet)."""

    version: int
    epoch: int
    worker: str | None


def rescue_due(records) -> Rescue | None:
    """From the call's log: is it open, and not yet redirected for its current worker?"""
    epoch, worker, version, claimed = 0, None, 0, set()
    for record in records:
        version = record.version
        if record.type in ("session.opened", "session.worker_attached"):
            epoch, worker = record.data.get("epoch", 1), record.data.get("worker")
        elif record.type == "session.closed":
            return None
        elif record.type == "anomaly.recorded" and record.data.get("kind") == GONE:
            claimed.add(record.data.get("detail", {}).get("epoch"))
    if epoch in claimed:
        return None  # claimed already, by this or another worker
    return Rescue(version, epoch, worker)


class CallLeases:
    """This worker's leases, and its sweep for calls whose worker is gone."""

    def __init__(self, config: BotConfig, store, worker_id: str):
        self.config = config
        self.store = store
        self.worker_id = worker_id
        self.ttl_s = config.call_lease_s
        self._engine: AsyncEngine | None = None
        self._twilio = None
        self._task: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.config.twilio_account_sid and self.config.twilio_auth_token)

    async def start(self) -> None:
        if not self.enabled:
            logger.warning("calls whose worker dies rely on Twilio following <Redirect> after "
                           "an abrupt close (undocumented): set TWILIO_ACCOUNT_SID to redirect "
                           "them through Twilio's REST API")
            return
        options = {}
        if self.config.database_url.startswith("postgresql") and self.config.database_schema:
            options["connect_args"] = {"server_settings": {
                "search_path": self.config.database_schema}}
        elif self.config.database_url.startswith("sqlite"):
            options["connect_args"] = {"timeout": 10}  # waits out the log's writers
        self._engine = create_async_engine(self.config.database_url, **options)
        async with self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Workers start together, and two CREATE TABLE IF NOT EXISTS at once can
                # both go ahead and one fail (pg_type's key, or "already exists"): one at
                # a time, the lock held to the commit.
                await conn.execute(select(func.pg_advisory_xact_lock(_LEASES_DDL_LOCK)))
            await conn.execute(CreateTable(leases, if_not_exists=True))
        from twilio.http.async_http_client import AsyncTwilioHttpClient
        from twilio.rest import Client
        self._twilio = Client(self.config.twilio_account_sid, self.config.twilio_auth_token,
                              http_client=AsyncTwilioHttpClient())
        if self.config.twilio_api_base_url:
            self._twilio.api.base_url = self.config.twilio_api_base_url
        self._task = asyncio.create_task(self._sweep_forever(), name="call_leases")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._twilio is not None:
            await self._twilio.http_client.session.close()
        if self._engine is not None:
            await self._engine.dispose()

    # ------------------------------------------------------------------ this worker's calls
    async def hold(self, call_sid: str) -> None:
        """This worker serves `call_sid` now (a new stream, a takeover)."""
        if self._engine is None:
            return
        try:
            await self._hold(call_sid)
        except Exception as exc:  # noqa: BLE001 - the call goes on, only without a rescue
            logger.warning(f"call {call_sid}: no lease (it will not be redirected if this "
                           f"worker dies): {type(exc).__name__}: {exc}")

    async def _hold(self, call_sid: str) -> None:
        for attempt in range(2):  # (an insert that lost to another stream's: update it)
            try:
                async with self._engine.begin() as conn:
                    values = {"worker": self.worker_id, "expires_at": time.time() + self.ttl_s,
                              "redirected_epoch": None}
                    done = await conn.execute(update(leases).where(
                        leases.c.call_sid == call_sid).values(**values))
                    if done.rowcount == 0:
                        await conn.execute(insert(leases).values(call_sid=call_sid, **values))
                return
            except IntegrityError:
                if attempt:
                    raise

    async def let_go(self, call_sid: str) -> None:
        """The stream ended here: forget an ended call; a call still open is left to expire
        (the next stream holds it again, else a sweep redirects it)."""
        if self._engine is None:
            return
        try:
            await self._let_go(call_sid)
        except Exception as exc:  # noqa: BLE001 - the lease expires anyway; a sweep decides
            logger.warning(f"call {call_sid}: could not let go of its lease: {exc}")

    async def _let_go(self, call_sid: str) -> None:
        head = await self.store.stream_head(call_sid)
        ended = False
        if head:
            last = await self.store.read(call_sid, from_version=head[0])
            ended = bool(last) and last[-1].type == "session.closed"
        async with self._engine.begin() as conn:
            mine = (leases.c.call_sid == call_sid) & (leases.c.worker == self.worker_id)
            if ended:
                await conn.execute(delete(leases).where(mine))
            else:
                await conn.execute(update(leases).where(mine).values(
                    worker=None, expires_at=time.time() + self.ttl_s))

    # ------------------------------------------------------------------ the sweep
    async def _sweep_forever(self) -> None:
        # Renewals in a task of their own: a sweep waiting on Twilio or the log must not
        # let this worker's own leases lapse.
        renewing = asyncio.create_task(self._every(self.renew, "renewal"))
        try:
            await self._every(self.sweep, "sweep")
        finally:
            renewing.cancel()  # and waited for: stop() disposes of the engine it uses
            await asyncio.gather(renewing, return_exceptions=True)

    async def _every(self, step, what: str) -> None:
        while True:
            try:
                await step()
            except Exception as exc:  # noqa: BLE001 - next round; the log says why
                logger.warning(f"call lease {what} failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(self.ttl_s / 5)

    async def renew(self) -> None:
        # The clock is read once the connection is ours: a renewal stamped before a wait for
        # the database (SQLite's write lock, a busy pool) lapsed early.
        async with self._engine.begin() as conn:
            await conn.execute(update(leases).where(leases.c.worker == self.worker_id)
                               .values(expires_at=time.time() + self.ttl_s))

    async def sweep(self) -> None:
        async with self._engine.connect() as conn:
            now = time.time()
            expired = (await conn.execute(select(leases.c.call_sid, leases.c.worker,
                                                 leases.c.expires_at)
                                          .where(leases.c.expires_at < now))).all()
        for call_sid, worker, _ in expired:
            await self._rescue(call_sid, worker)

    async def _rescue(self, call_sid: str, worker: str | None) -> None:
        records = await self.store.read(call_sid)
        if records and records[-1].recorded_at_us / 1e6 > time.time() - self.ttl_s:
            # Its worker wrote to the log within the lease: alive, only late to renew (seen
            # with every process of a loaded 2-core machine starved for seconds).
            return
        due = rescue_due(records)
        if due is None:  # ended, or already redirected for this worker
            async with self._engine.begin() as conn:
                await conn.execute(delete(leases).where(leases.c.call_sid == call_sid,
                                                        leases.c.expires_at < time.time(),
                                                        leases.c.redirected_epoch.is_(None)))
            return
        async with self._engine.begin() as conn:
            # The claim: only one sweeper's update finds the lease still expired and the call
            # not yet redirected for this epoch; a new stream's hold renews it first.
            claimed = await conn.execute(
                update(leases).where(
                    leases.c.call_sid == call_sid, leases.c.expires_at < time.time(),
                    (leases.c.redirected_epoch.is_(None))
                    | (leases.c.redirected_epoch != due.epoch))
                .values(redirected_epoch=due.epoch))
        if claimed.rowcount != 1:
            return
        if due.version:
            try:  # ... and in the call's log, at the version read: nothing moved since
                await self.store.append(call_sid, [ev.AnomalyRecorded(GONE, {
                    "worker": due.worker, "lease_worker": worker, "epoch": due.epoch,
                    "redirected_by": self.worker_id, "via": "twilio_rest_api"})],
                    due.version, epoch=due.epoch)
            except (ConcurrencyConflict, Fenced):
                logger.info(f"call {call_sid}: moved on while its redirect was claimed; "
                            "not redirected")
                return
        await self._redirect(call_sid, due)

    async def _redirect(self, call_sid: str, due: Rescue) -> None:
        from twilio.base.exceptions import TwilioRestException
        url = f"{self.config.public_url}/twiml"
        try:
            await self._twilio.api.v2010.accounts(self.config.twilio_account_sid) \
                .calls(call_sid).update_async(url=url, method="POST")
        except TwilioRestException as exc:
            if exc.code == CALL_OVER and due.version:
                await self._close_over(call_sid, due)
                return
            logger.warning(f"call {call_sid}: its worker {due.worker} is gone; Twilio refused "
                           f"the redirect ({exc.status}, code {exc.code}): {exc.msg}")
            return
        logger.info(f"call {call_sid}: its worker {due.worker} is gone (lease expired); "
                    f"redirected to {url} through Twilio's REST API")

    async def _close_over(self, call_sid: str, due: Rescue) -> None:
        """Twilio says the call is over (the caller hung up as its worker died, before it
        logged the end): the log says so too, after the claim, or the call stays open in
        it for ever. A worker that took the call over meanwhile wins (the append fails)."""
        try:
            await self.store.append(call_sid, [
                ev.AnomalyRecorded(ENDED_WHILE_GONE, {"worker": due.worker, "epoch": due.epoch,
                                                      "twilio_code": CALL_OVER}),
                ev.SessionClosed("ended")], due.version + 1, epoch=due.epoch)
        except (ConcurrencyConflict, Fenced):
            logger.info(f"call {call_sid}: moved on while it was being closed; left open")
            return
        logger.info(f"call {call_sid}: its worker {due.worker} is gone and Twilio says the "
                    f"call is over (code {CALL_OVER}): closed in its log")
