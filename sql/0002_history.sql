-- Delivery history, written by sluice-recorder from the sluice.outcomes topic (one writer).
--
--   delivery_attempts   one row per outcome record, every state         partitioned by day (ts)
--   deliveries          latest state per (event_id, endpoint_id)        plain table
--   endpoint_latency    latency samples of attempts that got a response partitioned by hour (ts)
--   endpoint_health     per endpoint: last outcome, consecutive failures, inferred breaker
--                       state, P50/P95/P99 over the rolling latency window
--   dead_letters        one row per (event_id, endpoint_id) that died, with the original
--                       delivery record for replay; readable only by role sluice_replay
--
-- Conventions
-- * Every timestamp is timestamptz and converted exactly from the record's unix milliseconds
--   (the recorder sends them as binary µs since 2000-01-01), so a key column built from a
--   timestamp is as stable as the record itself.
-- * "No value" is NULL, never 0: http_status NULL = no response, latency_us NULL = not measured.
-- * Idempotence: re-reading any outcome (a crash between COMMIT and the Kafka offset commit, a
--   rebalance, the same record produced twice) changes nothing. delivery_attempts dedups on a
--   key derived from the record alone; every other table is derived from the attempt rows that
--   were really inserted (INSERT ... ON CONFLICT DO NOTHING RETURNING) or is updated with
--   "only move forward" rules that are idempotent and order-independent. The recorder never
--   inserts an attempt older than history_retention_d (it would be dropped at once), so a row
--   removed by retention can never come back and be counted a second time.
-- * Partitions are named <table>_pYYYYMMDD (days) and <table>_pYYYYMMDDHH (hours), in UTC.
--   Each partitioned table also has a DEFAULT partition that catches rows for which no
--   partition exists (a backlog older than yesterday, a consumer with a wild clock), so an
--   insert never fails on routing; sluice_ensure_partitions() later moves such rows into
--   proper partitions. Both maintenance functions are safe for operators to run at any time.
-- * No foreign keys: the history must accept outcomes for unknown or deleted endpoints.
--   Nothing here is read by consumers: a PostgreSQL outage pauses the history, not delivery.
-- * Retention (config): history_retention_d for delivery_attempts partitions and deliveries
--   rows; latency_window_h (+1 h margin) for endpoint_latency partitions; dead_letter_retention_d
--   for dead_letters. Partitions are dropped, never mass-DELETEd; deliveries and dead_letters
--   are small enough for batched deletes (sluice_purge_*).

-- ==== Outcome states ====
-- The states of the outcome contract (schemas/README.md). Declared in precedence order: when two
-- outcomes for one (event, endpoint) carry the same timestamp, the later label wins (so a
-- dead_letter beats a retry_scheduled of the same millisecond). Comparisons with < and > on this
-- type follow this order. sluice-recorder ranks states in the same order in C (rec_agg_states in
-- recorder/rec_agg.c) and refuses a database whose labels or order differ (checked at connect).
do $$
begin
    if not exists (select 1 from pg_type where typname = 'outcome_state') then
        create type outcome_state as enum (
            'deferred',         -- rescheduled without spending an attempt (breaker, rate, shutdown)
            'retry_scheduled',  -- transient failure; next_at holds the due time
            'disabled',         -- endpoint disabled or unknown
            'quarantined',      -- the delivery record itself was invalid
            'dead_letter',      -- permanent failure or attempts exhausted
            'duplicate',        -- skipped: already delivered within the dedup window
            'delivered'         -- the endpoint answered 2xx
        );
    end if;
end
$$;

-- ==== delivery_attempts ====
-- One row per outcome record. Natural key (event_id, endpoint_id, attempt, state, ts): every part
-- comes from the record itself, so a re-read record maps to the same key, and the key includes
-- the partition key ts as PostgreSQL requires for a unique constraint on a partitioned table.
-- attempt alone is not enough: one attempt can produce several records (deferred outcomes carry
-- attempt 0 and repeat; a duplicate after a delivered), and ts tells those apart. Two distinct
-- records could only collide by having the same event, endpoint, attempt and state in the same
-- millisecond, which the consumer never produces.
-- Quarantined outcomes may lack id/endpoint (the delivery record was too broken): endpoint_id is
-- then '' (never a valid endpoint id) and event_id 'q_' followed by 16 hex digits of a hash of
-- the outcome record's bytes, so re-reads still dedup. Such rows appear only here.
create table if not exists delivery_attempts (
    event_id     text not null,              -- event id (1..128 visible ASCII)
    endpoint_id  text not null,              -- endpoint id; '' = unknown (quarantined only)
    attempt      bigint not null,            -- 1-based attempt; 0 = no attempt spent
    state        outcome_state not null,
    http_status  smallint,                   -- response status 100..999; NULL = no response
    err          text,                       -- error class (timeout, http_5xx, breaker_open...)
    msg          text,                       -- short human message from the consumer (<= 256 B)
    ts           timestamptz not null,       -- time of the outcome (record "ts")
    created_at   timestamptz,                -- event created-at (record "created"); NULL only
                                             -- for quarantined records without it
    latency_us   bigint,                     -- total request time, µs; NULL = not measured
    dns_us       bigint,                     -- DNS phase, µs; NULL = none
    conn_us      bigint,                     -- TCP connect phase, µs; NULL = none
    tls_us       bigint,                     -- TLS handshake, µs; NULL = none
    ttfb_us      bigint,                     -- time to first byte, µs; NULL = none
    next_at      timestamptz,                -- next attempt (retry_scheduled, deferred)
    pod          text,                       -- consumer instance that produced the outcome
    event_type   text,                       -- event type; NULL only for broken quarantined
    recorded_at  timestamptz not null default now(), -- when the recorder committed the row
    primary key (event_id, endpoint_id, attempt, state, ts)
) partition by range (ts);
create table if not exists delivery_attempts_default partition of delivery_attempts default;
-- Cheap time-range index for "last hour" style scans (rows arrive roughly in ts order).
create index if not exists delivery_attempts_ts_brin on delivery_attempts using brin (ts);

comment on table delivery_attempts is
    'one row per outcome record (sluice.outcomes); partitioned by day on ts (UTC); written only '
    'by sluice-recorder; key derived from the record, so re-reads never double count';

-- ==== deliveries ====
-- Latest state per (event_id, endpoint_id): the monitoring table. Upserted once per batch from the
-- newly inserted attempt rows, with "only move forward" rules (see deliveries_replaces below):
--   * delivered is final: nothing replaces it (a later retry or duplicate of a delivered event
--     does not undo the delivery); among several delivered outcomes the earliest one wins;
--   * otherwise the outcome with the greater (ts, state) wins, so a late-arriving older outcome
--     never overwrites a newer one;
--   * attempts, first_seen, first_failed_at and delivered_at are max/min aggregates.
-- These rules are a maximum over a total order, so the result does not depend on the order in
-- which outcomes arrive, and applying an outcome twice is a no-op.
-- Rows for quarantined outcomes without id/endpoint are not kept here.
create table if not exists deliveries (
    event_id         text not null,
    endpoint_id      text not null,
    event_type       text,                   -- NULL only for quarantined records without it
    state            outcome_state not null, -- state set by the winning outcome
    attempts         bigint not null,        -- highest attempt number seen (0 = none spent)
    first_seen       timestamptz not null,   -- earliest outcome ts seen
    last_update      timestamptz not null,   -- ts of the outcome that set state
    created_at       timestamptz,            -- event created-at
    delivered_at     timestamptz,            -- earliest delivered outcome ts; NULL = not yet
    first_failed_at  timestamptz,            -- earliest failed attempt (retry_scheduled or
                                             -- dead_letter); NULL = never failed
    next_attempt_at  timestamptz,            -- next_at of the winning outcome (retry/deferred)
    last_status      smallint,               -- http_status of the winning outcome
    last_error       text,                   -- err of the winning outcome
    last_msg         text,                   -- msg of the winning outcome
    recorded_at      timestamptz not null default now(), -- last time the recorder changed the row
    primary key (event_id, endpoint_id)
);
-- No index on last_update: it changes on most upserts and would cost every write; retention
-- (sluice_purge_deliveries) scans the heap instead, where old rows come first. Time-range
-- questions ("delivered in the last hour") belong to delivery_attempts (BRIN on ts).
-- Open work: awaiting retry / deferred, oldest first ("oldest undelivered").
create index if not exists deliveries_open_idx on deliveries (created_at)
    where state in ('retry_scheduled', 'deferred');

comment on table deliveries is
    'latest state per (event_id, endpoint_id); delivered is final, otherwise the newest (ts, state) '
    'wins; maintained by sluice-recorder';

-- Does an outcome (new_state at new_ts) replace the state set by (cur_state at cur_ts)?
-- The single definition of "only move forward" for deliveries; the recorder's per-batch
-- DISTINCT ON uses the same order. Inlined by the planner (plain SQL expression), but not inside
-- ON CONFLICT: the recorder's upsert writes it out (REC_DB_REPLACES_SQL, recorder/rec_db_int.h),
-- and tests/integration/test_rec_paths.c checks the two agree for every pair of states.
create or replace function deliveries_replaces(cur_state outcome_state, cur_ts timestamptz,
                                               new_state outcome_state, new_ts timestamptz)
returns boolean language sql immutable parallel safe as $$
    select case
        when cur_state = 'delivered' then new_state = 'delivered' and new_ts < cur_ts
        when new_state = 'delivered' then true
        else (new_ts, new_state) > (cur_ts, cur_state)
    end
$$;

-- ==== endpoint_latency ====
-- Latency samples: attempts that got an HTTP response (delivered, and failures with a status)
-- and a measured latency, within latency_window_h of now. Partitioned by hour; partitions older
-- than latency_window_h + 1 h are dropped by sluice_drop_old_partitions.
-- Deliberately no key and no index: a sample is inserted only together with its newly inserted
-- delivery_attempts row (same transaction), so it exists exactly once without a unique check;
-- and every reader scans whole hours (sluice_refresh_endpoint_health sorts the window per
-- endpoint). Measured on the dev machine, a unique index (ON CONFLICT) made this the most
-- expensive insert of a batch and drove the percentile query into random index order. For a
-- one-endpoint ad-hoc window use endpoint_health first; an index (endpoint_id, ts) can be added
-- if such queries become frequent, at a cost on every write.
create table if not exists endpoint_latency (
    endpoint_id  text not null,
    ts           timestamptz not null,       -- time of the outcome
    event_id     text not null,
    attempt      bigint not null,            -- attempt number of the sample
    latency_us   bigint not null,            -- total request time, µs
    http_status  smallint not null           -- response status
) partition by range (ts);
create table if not exists endpoint_latency_default partition of endpoint_latency default;

comment on table endpoint_latency is
    'latency samples of attempts with a response; partitioned by hour on ts (UTC); kept for '
    'latency_window_h + 1 h';

-- ==== endpoint_health ====
-- One row per endpoint that has produced outcomes.
-- * last_* and consecutive_failures are updated by the recorder in the same transaction as the
--   attempts they come from, counting only newly inserted attempts (exactly once).
--   consecutive_failures = failed attempts (retry_scheduled / dead_letter with attempt > 0)
--   newer than last_success_at. A success that arrives after failures newer than it were
--   counted resets the count to the failures of its own batch: an approximation, documented.
-- * breaker_state is inferred from outcomes, not read from Redis: 'open' when the newest outcome
--   is a deferral with err breaker_open, 'closed' when it is a delivery, else unchanged
--   ('unknown' until either is seen). Redis holds the authoritative breaker.
-- * samples / p50_us / p95_us / p99_us / avg_us are refreshed every ~30 s by the recorder
--   (sluice_refresh_endpoint_health) from endpoint_latency over window_hours; samples = 0 and
--   NULL percentiles when the window holds no sample.
create table if not exists endpoint_health (
    endpoint_id           text primary key,
    breaker_state         text not null default 'unknown'
                          check (breaker_state in ('unknown', 'closed', 'open')),
    consecutive_failures  bigint not null default 0,
    last_outcome_state    outcome_state,     -- newest outcome by (ts, state)
    last_outcome_at       timestamptz,
    last_status           smallint,          -- its http_status
    last_error            text,              -- its err
    last_success_at       timestamptz,       -- newest delivered outcome
    last_failure_at       timestamptz,       -- newest failed attempt
    window_hours          integer,           -- window of the statistics below, hours
    samples               bigint not null default 0, -- latency samples in the window
    p50_us                bigint,            -- percentile_cont over the window, µs
    p95_us                bigint,
    p99_us                bigint,
    avg_us                bigint,
    stats_at              timestamptz,       -- last statistics refresh
    updated_at            timestamptz not null default now() -- last change of any column
);

comment on table endpoint_health is
    'per endpoint: newest outcome, consecutive failures, breaker state inferred from outcomes, '
    'latency percentiles over the rolling window; maintained by sluice-recorder';

-- ==== dead_letters ====
-- One row per (event_id, endpoint_id) whose delivery died. payload is the complete original
-- delivery record (the outcome's env), for replay; it may hold personal data, so the table is
-- readable only by role sluice_replay (and its owner), and rows are deleted
-- dead_letter_retention_d days after dead_at (sluice_purge_dead_letters, batched: the table is
-- small and not partitioned).
-- A newer dead_letter outcome for the same key (the event died again, e.g. after a replay)
-- replaces the row's failure details, clears replayed_at and resolved_at, and keeps
-- replay_count; an older or repeated one changes nothing. resolved_at is set when a delivered
-- outcome newer than dead_at arrives (typically after a replay).
create table if not exists dead_letters (
    event_id         text not null,
    endpoint_id      text not null,
    event_type       text,
    payload          bytea,                  -- original delivery record (msgpack); NULL when
                                             -- the consumer did not keep it
    error_class      text,                   -- err of the dead_letter outcome
    last_status      smallint,               -- its http_status; NULL = no response
    last_msg         text,                   -- its msg
    last_response    bytea,                  -- first bytes of the response body (<= 4 KiB)
    attempts         bigint not null,        -- attempts spent (the outcome's attempt)
    created_at       timestamptz,            -- event created-at
    first_failed_at  timestamptz not null,   -- earliest failed attempt seen (else dead_at)
    dead_at          timestamptz not null,   -- ts of the dead_letter outcome
    replayed_at      timestamptz,            -- set by replay; NULL = not replayed since dead_at
    replay_count     integer not null default 0, -- replays so far (set by replay)
    resolved_at      timestamptz,            -- delivered after dead_at; NULL = still dead
    recorded_at      timestamptz not null default now(),
    primary key (event_id, endpoint_id)
);
create index if not exists dead_letters_dead_at_idx on dead_letters (dead_at);
create index if not exists dead_letters_endpoint_idx on dead_letters (endpoint_id, dead_at);

comment on table dead_letters is
    'deliveries that died, with the original record for replay; payload access restricted to '
    'role sluice_replay; deleted dead_letter_retention_d days after dead_at';

-- ==== Roles ====
-- sluice_replay: reads dead letters (payload included) and marks replays. sluice_analyst (from
-- 0001): reads the history, and dead_letters without payload and response body.
-- The sluice user owns every table, so the recorder and sluicectl keep full access.
do $$
begin
    if not exists (select 1 from pg_roles where rolname = 'sluice_replay') then
        create role sluice_replay nologin;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'sluice_analyst') then
        create role sluice_analyst nologin;
    end if;
end
$$;
revoke all on dead_letters from public;
grant select, update (replayed_at, replay_count) on dead_letters to sluice_replay;
grant select (event_id, endpoint_id, event_type, error_class, last_status, last_msg, attempts,
              created_at, first_failed_at, dead_at, replayed_at, replay_count, resolved_at,
              recorded_at)
    on dead_letters to sluice_analyst;
grant select on delivery_attempts, deliveries, endpoint_latency, endpoint_health to sluice_analyst;

-- ==== Partition management ====
-- All functions run with TimeZone = UTC so partition boundaries and names are UTC.

-- Create partition <parent>_p<suffix> for [lo, hi) unless it exists. Rows already parked in
-- the default partition for that range are moved into it first (a partition cannot be created
-- over rows in the default partition). Returns 1 if created, 0 if it existed.
create or replace function sluice_partition_add(p_parent text, p_lo timestamptz,
                                                p_hi timestamptz, p_suffix text)
returns integer language plpgsql set timezone = 'UTC' as $$
declare
    v_name text := p_parent || '_p' || p_suffix;
    v_default text := p_parent || '_default';
begin
    if to_regclass(v_name) is not null then
        return 0;
    end if;
    -- Block inserts into the default partition until the new range is attached.
    execute format('lock table %I in share row exclusive mode', v_default);
    execute format('create table %I (like %I including defaults including constraints)',
                   v_name, p_parent);
    execute format('with moved as (delete from %I where ts >= $1 and ts < $2 returning *) '
                   'insert into %I select * from moved', v_default, v_name)
        using p_lo, p_hi;
    execute format('alter table %I attach partition %I for values from (%L) to (%L)',
                   p_parent, v_name, p_lo, p_hi);
    return 1;
end
$$;

-- Create the partitions that should exist: delivery_attempts for yesterday .. today + days_ahead,
-- endpoint_latency for the previous hour .. end of today + days_ahead, plus a partition for
-- every day / hour that has rows parked in a default partition (which moves them). Idempotent.
-- Returns the number of partitions created. Called by the recorder every minute.
create or replace function sluice_ensure_partitions(p_days_ahead integer default 2)
returns integer language plpgsql set timezone = 'UTC' as $$
declare
    v_today timestamptz := date_trunc('day', now());
    v_hour timestamptz := date_trunc('hour', now());
    v_t timestamptz;
    v_n integer := 0;
begin
    if p_days_ahead < 0 or p_days_ahead > 366 then
        raise exception 'p_days_ahead must be in 0..366, got %', p_days_ahead;
    end if;
    for v_t in select generate_series(v_today - interval '1 day',
                                      v_today + make_interval(days => p_days_ahead),
                                      interval '1 day')
    loop
        v_n := v_n + sluice_partition_add('delivery_attempts', v_t, v_t + interval '1 day',
                                          to_char(v_t, 'YYYYMMDD'));
    end loop;
    for v_t in select generate_series(v_hour - interval '1 hour',
                                      v_today + make_interval(days => p_days_ahead + 1)
                                          - interval '1 hour',
                                      interval '1 hour')
    loop
        v_n := v_n + sluice_partition_add('endpoint_latency', v_t, v_t + interval '1 hour',
                                          to_char(v_t, 'YYYYMMDDHH24'));
    end loop;
    -- Parked rows: a backlog from before yesterday, or outcomes from a clock far ahead.
    for v_t in select distinct date_trunc('day', ts) from delivery_attempts_default loop
        v_n := v_n + sluice_partition_add('delivery_attempts', v_t, v_t + interval '1 day',
                                          to_char(v_t, 'YYYYMMDD'));
    end loop;
    for v_t in select distinct date_trunc('hour', ts) from endpoint_latency_default loop
        v_n := v_n + sluice_partition_add('endpoint_latency', v_t, v_t + interval '1 hour',
                                          to_char(v_t, 'YYYYMMDDHH24'));
    end loop;
    return v_n;
end
$$;

-- Drop delivery_attempts partitions whose whole day ended more than history_days ago and
-- endpoint_latency partitions whose hour ended more than latency_hours ago (DROP TABLE, never a
-- mass DELETE), and delete the same expired rows from the default partitions (normally empty).
-- Only partitions named by sluice_partition_add are considered. Returns partitions dropped.
-- The recorder calls it with (history_retention_d, latency_window_h + 1) every minute.
create or replace function sluice_drop_old_partitions(p_history_days integer default 14,
                                                      p_latency_hours integer default 25)
returns integer language plpgsql set timezone = 'UTC' as $$
declare
    v_cut_days timestamptz := now() - make_interval(days => p_history_days);
    v_cut_hours timestamptz := now() - make_interval(hours => p_latency_hours);
    r record;
    v_n integer := 0;
begin
    if p_history_days < 1 or p_latency_hours < 1 then
        raise exception 'retention must be at least 1 day and 1 hour';
    end if;
    for r in
        select c.relname,
               to_timestamp(substr(c.relname, length('delivery_attempts_p') + 1), 'YYYYMMDD')
                   + interval '1 day' as hi
          from pg_inherits i
          join pg_class c on c.oid = i.inhrelid
         where i.inhparent = 'delivery_attempts'::regclass
           and c.relname ~ '^delivery_attempts_p[0-9]{8}$'
    loop
        if r.hi <= v_cut_days then
            execute format('drop table %I', r.relname);
            v_n := v_n + 1;
        end if;
    end loop;
    for r in
        select c.relname,
               to_timestamp(substr(c.relname, length('endpoint_latency_p') + 1), 'YYYYMMDDHH24')
                   + interval '1 hour' as hi
          from pg_inherits i
          join pg_class c on c.oid = i.inhrelid
         where i.inhparent = 'endpoint_latency'::regclass
           and c.relname ~ '^endpoint_latency_p[0-9]{10}$'
    loop
        if r.hi <= v_cut_hours then
            execute format('drop table %I', r.relname);
            v_n := v_n + 1;
        end if;
    end loop;
    delete from delivery_attempts_default where ts < v_cut_days;
    delete from endpoint_latency_default where ts < v_cut_hours;
    return v_n;
end
$$;

-- ==== Retention of the plain tables (batched deletes) ====
-- Each call deletes at most p_limit rows and returns how many it deleted; callers repeat
-- while the result equals p_limit (each call its own transaction keeps locks and WAL short).
create or replace function sluice_purge_dead_letters(p_days integer, p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select event_id, endpoint_id from dead_letters
         where dead_at < now() - make_interval(days => p_days)
         order by dead_at
         limit p_limit
    ), gone as (
        delete from dead_letters d using victims v
         where d.event_id = v.event_id and d.endpoint_id = v.endpoint_id
        returning 1
    )
    select count(*) from gone
$$;

-- deliveries has no last_update index (see above): a heap scan finds the oldest rows first,
-- since rows are appended in time order.
create or replace function sluice_purge_deliveries(p_days integer, p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select ctid from deliveries
         where last_update < now() - make_interval(days => p_days)
         limit p_limit
    ), gone as (
        delete from deliveries where ctid in (select ctid from victims)
        returning 1
    )
    select count(*) from gone
$$;

-- ==== endpoint_health statistics ====
-- Recompute samples and P50/P95/P99/avg over the last p_window_hours of endpoint_latency for
-- every endpoint (creating endpoint_health rows for endpoints seen only in samples); endpoints
-- without samples in the window get samples = 0 and NULL statistics. Returns the number of
-- endpoints with samples. Cost: one scan and one sort of the window's samples per call (hence
-- the work_mem, which keeps a few million samples in memory).
create or replace function sluice_refresh_endpoint_health(p_window_hours integer default 24)
returns integer language plpgsql set work_mem = '128MB' as $$
declare
    v_now timestamptz := now();
    v_n integer;
begin
    with s as (
        select endpoint_id, count(*) as n,
               percentile_cont(array[0.5, 0.95, 0.99]) within group (order by latency_us) as p,
               avg(latency_us) as a
          from endpoint_latency
         where ts >= v_now - make_interval(hours => p_window_hours)
         group by endpoint_id
    )
    insert into endpoint_health as h (endpoint_id, window_hours, samples, p50_us, p95_us, p99_us,
                                      avg_us, stats_at, updated_at)
    select endpoint_id, p_window_hours, n, round(p[1])::bigint, round(p[2])::bigint,
           round(p[3])::bigint, round(a)::bigint, v_now, v_now
      from s
     order by endpoint_id  -- the recorder's writers lock endpoint_health rows in this order too
    on conflict (endpoint_id) do update
       set window_hours = excluded.window_hours, samples = excluded.samples,
           p50_us = excluded.p50_us, p95_us = excluded.p95_us, p99_us = excluded.p99_us,
           avg_us = excluded.avg_us, stats_at = excluded.stats_at, updated_at = excluded.updated_at;
    get diagnostics v_n = row_count;
    update endpoint_health
       set window_hours = p_window_hours, samples = 0, p50_us = null, p95_us = null,
           p99_us = null, avg_us = null, stats_at = v_now, updated_at = v_now
     where stats_at is distinct from v_now
       and (samples <> 0 or stats_at is null or window_hours is distinct from p_window_hours);
    return v_n;
end
$$;

-- The partitions a fresh database needs right away.
select sluice_ensure_partitions();
