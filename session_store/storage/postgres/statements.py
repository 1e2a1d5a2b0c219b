"""The SQL of a PostgreSQL commit, written for asyncpg (array parameters, `unnest`): the
transaction path's statements, and the one-round-trip appends of a batch planned from cached
heads (one stream: one statement; several: a temporary function per writer connection)."""

from __future__ import annotations

from ..schema import events, streams

_S, _E = streams.name, events.name
SELECT_HEADS = (f"SELECT stream_id, version, last_hash, epoch FROM {_S} "
                 "WHERE stream_id = ANY($1::text[]) ORDER BY stream_id FOR UPDATE")
# The stored hashes at (stream, version) pairs: what a retried request committed, if it did.
SELECT_HASHES = (f"SELECT e.stream_id, e.version, e.hash FROM {_E} AS e JOIN "
                  "unnest($1::text[], $2::bigint[]) AS u(s, v) "
                  "ON e.stream_id = u.s AND e.version = u.v")
# Where a call a takeover claims was closed after what its caller read.
SELECT_CLOSED = (f"SELECT u.s, u.a, min(e.version) FROM unnest($1::text[], $2::bigint[]) "
                  f"AS u(s, a) JOIN {_E} AS e ON e.stream_id = u.s AND e.version > u.a "
                  "AND e.type = $3 GROUP BY u.s, u.a")
INSERT_STREAMS = (
    f"INSERT INTO {_S} (stream_id, version, last_hash, epoch, created_at_us, updated_at_us) "
    "SELECT s, v, h, e, t, t FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], "
    "$5::bigint[]) AS u(s, v, h, e, t) ON CONFLICT (stream_id) DO NOTHING RETURNING stream_id")
UPDATE_STREAMS = (
    f"UPDATE {_S} SET version = u.v, last_hash = u.h, epoch = u.e, updated_at_us = u.t "
    "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[]) "
    f"AS u(s, v, h, e, t) WHERE {_S}.stream_id = u.s")
# The NOTIFY rides in the same statement; it is delivered when the transaction commits.
INSERT_EVENTS = (
    f"WITH ins AS (INSERT INTO {_E} (tx_order, stream_id, version, type, schema_version, data, "
    "recorded_at_us, hash) SELECT pg_current_xact_id()::text::bigint, s, v, ty, sv, d, t, h "
    "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::bigint[], "
    "$7::text[]) AS u(s, v, ty, sv, d, t, h)) SELECT pg_notify($8, '')")


# What a tailing reader may see: rows of transactions below the oldest one still running
# that may yet commit an event here. Ours take a lock that lets them write the heads or the
# log (RowShare from FOR UPDATE, RowExclusive from INSERT/UPDATE) before they get a
# transaction id, and keep it until they end. A transaction with an id that holds no such
# lock is a bystander, left out of the statement snapshot's running list: another schema's
# writer, a report, a partitioned client; one that only reads or ANALYZEs this log
# (AccessShare, ShareUpdateExclusive: autovacuum, a database-wide ANALYZE).
#
# Only while it still runs, asked after pg_locks was read: a transaction that is ending
# leaves the running list, then drops its relation locks (fast-path ones first) and then its
# id's lock, so for a moment a writer of ours that this snapshot saw running, whose rows it
# does not see, looks like a bystander. pg_locks holds 32-bit ids, the snapshot 64.
#
# `unsettled`: what sets the horizon is not a writer of ours seen running (it ended after
# the snapshot, or its id's lock is not in place yet), so it may hold rows back for nothing;
# reading again settles it. `xmax`: the snapshot's first id not yet given out.
READERS_HORIZON = f"""
WITH snap AS (SELECT pg_current_snapshot() AS s),
locks AS MATERIALIZED (SELECT locktype, database, relation, virtualtransaction,
                              transactionid, mode, granted FROM pg_locks),
ours AS (SELECT virtualtransaction FROM locks
         WHERE locktype = 'relation' AND relation IN ('{_S}'::regclass, '{_E}'::regclass)
           AND mode IN ('RowShareLock', 'RowExclusiveLock', 'ShareRowExclusiveLock',
                        'ExclusiveLock', 'AccessExclusiveLock')
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
ids AS (SELECT transactionid::text::bigint AS xid32,
               virtualtransaction IN (SELECT virtualtransaction FROM ours) AS writer
        FROM locks WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted),
oldest AS (SELECT min(x::text::bigint) AS xid FROM snap, pg_snapshot_xip(snap.s) AS x
           WHERE CASE WHEN x::text::bigint % 4294967296 IN (SELECT xid32 FROM ids
                                                            WHERE NOT writer)
                      THEN pg_xact_status(x) <> 'in progress'
                      ELSE true END)
SELECT coalesce(oldest.xid, (SELECT pg_snapshot_xmax(s)::text::bigint FROM snap)) AS horizon,
       oldest.xid IS NOT NULL AND oldest.xid % 4294967296 NOT IN (
           SELECT xid32 FROM ids WHERE writer) AS unsettled,
       (SELECT pg_snapshot_xmax(s)::text::bigint FROM snap) AS xmax
FROM oldest"""


# SQLSTATE the function raises when a head moved (a class no PostgreSQL error uses).
HEADS_MOVED = "SSH01"
_FN = "pg_temp.session_store_append"
CREATE_FN = f"""
CREATE OR REPLACE FUNCTION {_FN}(
    text[], bigint[], text[], bigint[], bigint[], bigint[], text[], bigint[],
    text[], bigint[], text[], int[], text[], bigint[], text[], text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    moved bigint;
BEGIN
    -- Heads locked in one global order, as on the transaction path: writers never deadlock.
    -- (One head is locked by the UPDATE itself.)
    IF cardinality($1) > 1 THEN
        PERFORM 1 FROM {_S} WHERE stream_id = ANY($1) ORDER BY stream_id FOR UPDATE;
    END IF;
    UPDATE {_S} AS st SET version = u.v, last_hash = u.h, epoch = u.e, updated_at_us = u.t
    FROM unnest($1, $2, $3, $4, $5, $6, $7, $8) AS u(s, v, h, e, t, ov, oh, oe)
    WHERE st.stream_id = u.s AND st.version = u.ov AND st.last_hash = u.oh AND st.epoch = u.oe;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved <> cardinality($1) THEN
        RAISE EXCEPTION 'a stream head moved since it was cached' USING ERRCODE = '{HEADS_MOVED}';
    END IF;
    INSERT INTO {_E} (tx_order, stream_id, version, type, schema_version, data, recorded_at_us,
                      hash)
    SELECT pg_current_xact_id()::text::bigint, s, v, ty, sv, d, t, h
    FROM unnest($9, $10, $11, $12, $13, $14, $15) AS u(s, v, ty, sv, d, t, h);
    PERFORM pg_notify($16, '');
END
$fn$"""
CALL_FN = f"SELECT {_FN}({', '.join(f'${i}' for i in range(1, 17))})"
# One stream: one plain statement (cheaper than the function). Nothing to undo if the head
# moved: no row updated, so no event inserted; it then returns no row.
APPEND_ONE = f"""
WITH head AS (
    UPDATE {_S} SET version = $2, last_hash = $3, epoch = $4, updated_at_us = $5
    WHERE stream_id = $1 AND version = $6 AND last_hash = $7 AND epoch = $8 RETURNING 1),
ins AS (
    INSERT INTO {_E} (tx_order, stream_id, version, type, schema_version, data, recorded_at_us,
                      hash)
    SELECT pg_current_xact_id()::text::bigint, $1, v, ty, sv, d, t, h
    FROM unnest($9::bigint[], $10::text[], $11::int[], $12::text[], $13::bigint[], $14::text[])
        AS u(v, ty, sv, d, t, h)
    WHERE EXISTS (SELECT 1 FROM head))
SELECT pg_notify($15, '') FROM head"""
