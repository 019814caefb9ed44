-- Analysis and operations on the delivery history (sql/0002_history.sql): the queries behind
-- `sluicectl health | slow | dead-letters | alerts | latency`, and the bookkeeping behind
-- `sluicectl replay` and `sluicectl retries rebuild`.
--
--   sluice_health_summary(window)            one row: open work, dead letters, delivered and
--                                            failed in the window, oldest undelivered, latency
--   sluice_slow_endpoints(ms, n, window)     endpoints whose P95 is over a threshold
--   sluice_dead_letter_analysis(window, ep)  per endpoint: counts, commonest error and status,
--                                            first/last, attempts, and the named patterns
--   sluice_alerts(...)                       one row per firing alert
--   sluice_latency(ep, window)               P50/P95/P99 and a fixed-bucket histogram
--   sluice_latency_histogram(ep, window)     the same histogram, one row per bucket
--   replay_log                               journal of `sluicectl replay` (crash safety)
--   sluice_replay_recover()                  finish the marking of an interrupted replay
--   pending_payloads                         delivery records of open retries, for rebuild
--   sluice_purge_pending_payloads(limit)     drop those of deliveries that are finished
--   sluice_purge_replay_log(days, limit)     retention of the replay journal
--
-- Conventions
-- * "In the window" means ts >= now() - window, with no upper bound (an outcome stamped a
--   little ahead by a fast consumer clock still counts). now() is the transaction's start.
-- * Latencies come from endpoint_latency: one sample per attempt that got an HTTP response
--   (any status), so the figures describe how fast endpoints answer. That table keeps only
--   latency_window_h (+1 h) of samples: a longer window sees no more than that.
-- * Percentiles are percentile_cont (linear interpolation), as in endpoint_health, in
--   milliseconds as double precision.
-- * Dead-letter figures come from dead_letters: one row per (event, endpoint), at its LATEST
--   death (dead_at). An event that died, was replayed and died again counts once, at the
--   second death.
-- * Every function validates its arguments and raises SQLSTATE 22023 (invalid_parameter_value)
--   naming the parameter. All are read-only except the replay/rebuild bookkeeping.

-- ==== Indexes on the history for these queries ====
-- Unreplayed, unresolved dead letters: the replay selection and the health count. Small
-- (only rows still waiting for an operator), so it costs the recorder next to nothing.
create index if not exists dead_letters_unreplayed_idx on dead_letters (dead_at)
    where replayed_at is null and resolved_at is null;

-- ==== Argument checks ====
create or replace function sluice__check_window(p_name text, p_window interval)
returns void language plpgsql immutable as $$
begin
    if p_window is null or p_window <= interval '0' then
        raise exception '% must be a positive interval', p_name using errcode = '22023';
    end if;
    if p_window > interval '366 days' then
        raise exception '% must be at most 366 days', p_name using errcode = '22023';
    end if;
end
$$;

-- ==== Health summary ====
-- One row, figures from PostgreSQL only (sluicectl health adds Kafka lag and the Redis
-- schedule, the only places that know what is queued and in flight right now):
--   awaiting_retry         deliveries whose latest state is retry_scheduled
--   deferred               deliveries whose latest state is deferred (breaker, rate, shutdown)
--   dead_letters_unreplayed  dead letters not replayed since their death and not resolved
--   dead_letters_window    dead letters whose (latest) death is in the window
--   delivered_window       delivered outcomes in the window (one per 2xx answer)
--   failed_attempts_window failed attempts in the window: retry_scheduled and dead_letter
--                          outcomes that spent an attempt (attempt > 0); deferrals, duplicates,
--                          disabled and quarantined outcomes spend none and are not counted
--   oldest_undelivered_at  created_at of the oldest delivery not in a final state (its latest
--                          state is retry_scheduled or deferred); NULL = none
--   oldest_undelivered_age_s  now() - that, seconds
--   latency_samples, avg_latency_ms, p95_latency_ms  over the window's latency samples
--                          (NULL when there is none)
create or replace function sluice_health_summary(p_window interval default interval '1 hour')
returns table (
    as_of                    timestamptz,
    window_s                 bigint,
    awaiting_retry           bigint,
    deferred                 bigint,
    dead_letters_unreplayed  bigint,
    dead_letters_window      bigint,
    delivered_window         bigint,
    failed_attempts_window   bigint,
    oldest_undelivered_at    timestamptz,
    oldest_undelivered_age_s double precision,
    latency_samples          bigint,
    avg_latency_ms           double precision,
    p95_latency_ms           double precision
) language plpgsql stable as $$
declare
    v_now timestamptz := now();
    v_since timestamptz;
begin
    perform sluice__check_window('p_window', p_window);
    v_since := v_now - p_window;
    return query
    with open as (
        select count(*) filter (where d.state = 'retry_scheduled') as r,
               count(*) filter (where d.state = 'deferred') as f,
               min(d.created_at) as oldest
          from deliveries d
         where d.state in ('retry_scheduled', 'deferred')
    ), att as (
        select count(*) filter (where a.state = 'delivered') as ok,
               count(*) filter (where a.state in ('retry_scheduled', 'dead_letter')
                                  and a.attempt > 0) as bad
          from delivery_attempts a
         where a.ts >= v_since
           and a.state in ('delivered', 'retry_scheduled', 'dead_letter')
    ), lat as (
        select count(*) as n, avg(l.latency_us)::float8 / 1000 as a,
               percentile_cont(0.95) within group (order by l.latency_us) / 1000 as p95
          from endpoint_latency l
         where l.ts >= v_since
    )
    select v_now,
           extract(epoch from p_window)::bigint,
           open.r, open.f,
           (select count(*) from dead_letters x
             where x.replayed_at is null and x.resolved_at is null),
           (select count(*) from dead_letters x where x.dead_at >= v_since),
           att.ok, att.bad,
           open.oldest,
           extract(epoch from (v_now - open.oldest))::double precision,
           lat.n, lat.a::double precision, lat.p95::double precision
      from open, att, lat;
end
$$;

-- ==== Slow endpoints ====
-- Endpoints whose P95 latency over the window is above p_threshold_ms, among those with at
-- least p_min_samples samples in the window (the rule of the breaker's slow threshold and of
-- the "P95 over threshold" alert). last_status / last_error: the endpoint's newest outcome
-- (endpoint_health; NULL status = no response). Slowest first.
create or replace function sluice_slow_endpoints(p_threshold_ms double precision default 2000,
                                                 p_min_samples bigint default 20,
                                                 p_window interval default interval '24 hours')
returns table (
    endpoint_id    text,
    samples        bigint,
    p50_ms         double precision,
    p95_ms         double precision,
    p99_ms         double precision,
    avg_ms         double precision,
    max_ms         double precision,
    last_sample_at timestamptz,
    last_status    smallint,
    last_error     text
) language plpgsql stable as $$
begin
    perform sluice__check_window('p_window', p_window);
    if p_threshold_ms is null or p_threshold_ms < 0 then
        raise exception 'p_threshold_ms must be >= 0' using errcode = '22023';
    end if;
    if p_min_samples is null or p_min_samples < 1 then
        raise exception 'p_min_samples must be >= 1' using errcode = '22023';
    end if;
    return query
    with s as (
        select l.endpoint_id, count(*) as n,
               percentile_cont(array[0.5, 0.95, 0.99]) within group (order by l.latency_us) as p,
               avg(l.latency_us) as a, max(l.latency_us) as mx, max(l.ts) as last_ts
          from endpoint_latency l
         where l.ts >= now() - p_window
         group by l.endpoint_id
        having count(*) >= p_min_samples
    )
    select s.endpoint_id, s.n, s.p[1] / 1000, s.p[2] / 1000, s.p[3] / 1000,
           s.a::float8 / 1000, s.mx::float8 / 1000, s.last_ts,
           h.last_status, h.last_error
      from s
      left join endpoint_health h on h.endpoint_id = s.endpoint_id
     where s.p[2] / 1000 > p_threshold_ms
     order by s.p[2] desc, s.endpoint_id;
end
$$;

-- ==== Dead-letter analysis ====
-- Per endpoint, over the dead letters whose (latest) death is in the window, optionally for one
-- endpoint only:
--   dead_letters, unreplayed (replayed_at and resolved_at NULL), without_payload (cannot be
--   replayed), top_error / top_error_count (commonest error_class), top_status /
--   top_status_count (commonest last_status; NULL = no response is a value of its own), ties
--   broken by the smaller value, NULL last; first_dead_at / last_dead_at; first_failed_at
--   (earliest failed attempt of any of them); avg_attempts.
-- Pattern evidence and the patterns, each named in `patterns` when its rule holds (several
-- may hold at once; the rules are independent):
--   "clustered outage"       cluster_count >= p_cluster_min (10) AND cluster_count >=
--                            p_cluster_share (0.8) * dead_letters, where cluster_count is the
--                            largest number of the endpoint's dead letters whose dead_at lies in
--                            one closed span [t, t + p_cluster_span (15 min)], t = the dead_at
--                            of one of them (cluster_start = the earliest such t).
--   "auth/permission spike"  auth_count = dead letters with last_status 401 or 403;
--                            auth_count >= p_spike_min (5) AND auth_count > p_spike_share
--                            (0.5) * dead_letters (they dominate: more than half).
--   "rate-limit spike"       rate_limit_count = dead letters with last_status 429 (attempts
--                            exhausted while throttled); same rule as above.
--   "gradual accumulation"   hours_present >= p_gradual_hours (6), where hours_present is the
--                            number of distinct hours of the window, counted back from now()
--                            (hour k = [now - (k+1) h, now - k h)), that hold at least one of
--                            the endpoint's dead letters. A window shorter than p_gradual_hours
--                            hours can never show it.
-- Most dead letters first.
create or replace function sluice_dead_letter_analysis(
    p_window          interval default interval '24 hours',
    p_endpoint        text default null,
    p_cluster_span    interval default interval '15 minutes',
    p_cluster_share   double precision default 0.8,
    p_cluster_min     bigint default 10,
    p_spike_share     double precision default 0.5,
    p_spike_min       bigint default 5,
    p_gradual_hours   integer default 6)
returns table (
    endpoint_id       text,
    dead_letters      bigint,
    unreplayed        bigint,
    without_payload   bigint,
    top_error         text,
    top_error_count   bigint,
    top_status        smallint,
    top_status_count  bigint,
    first_dead_at     timestamptz,
    last_dead_at      timestamptz,
    first_failed_at   timestamptz,
    avg_attempts      double precision,
    auth_count        bigint,
    rate_limit_count  bigint,
    cluster_count     bigint,
    cluster_start     timestamptz,
    hours_present     integer,
    patterns          text[]
) language plpgsql stable as $$
declare
    v_now timestamptz := now();
begin
    perform sluice__check_window('p_window', p_window);
    perform sluice__check_window('p_cluster_span', p_cluster_span);
    if p_cluster_share is null or p_cluster_share <= 0 or p_cluster_share > 1
       or p_spike_share is null or p_spike_share < 0 or p_spike_share >= 1 then
        raise exception 'p_cluster_share must be in (0, 1] and p_spike_share in [0, 1)'
            using errcode = '22023';
    end if;
    if p_cluster_min is null or p_cluster_min < 1 or p_spike_min is null or p_spike_min < 1
       or p_gradual_hours is null or p_gradual_hours < 1 then
        raise exception 'p_cluster_min, p_spike_min and p_gradual_hours must be >= 1'
            using errcode = '22023';
    end if;
    return query
    with d as (
        select x.endpoint_id, x.error_class, x.last_status, x.attempts, x.dead_at,
               x.first_failed_at, x.replayed_at, x.resolved_at, x.payload is null as nopay
          from dead_letters x
         where x.dead_at >= v_now - p_window
           and (p_endpoint is null or x.endpoint_id = p_endpoint)
    ), base as (
        select d.endpoint_id, count(*) as n,
               count(*) filter (where d.replayed_at is null and d.resolved_at is null) as unrep,
               count(*) filter (where d.nopay) as nopay,
               min(d.dead_at) as first_at, max(d.dead_at) as last_at,
               min(d.first_failed_at) as ff, avg(d.attempts)::double precision as att,
               count(*) filter (where d.last_status in (401, 403)) as auth_n,
               count(*) filter (where d.last_status = 429) as rl_n,
               count(distinct floor(extract(epoch from (v_now - d.dead_at)) / 3600))::integer
                   as hours
          from d
         group by d.endpoint_id
    ), err as (
        select distinct on (d.endpoint_id) d.endpoint_id, d.error_class, count(*) as c
          from d
         group by d.endpoint_id, d.error_class
         order by d.endpoint_id, count(*) desc, d.error_class asc nulls last
    ), st as (
        select distinct on (d.endpoint_id) d.endpoint_id, d.last_status, count(*) as c
          from d
         group by d.endpoint_id, d.last_status
         order by d.endpoint_id, count(*) desc, d.last_status asc nulls last
    ), cl as (
        select distinct on (w.endpoint_id) w.endpoint_id, w.dead_at as start, w.c
          from (select d.endpoint_id, d.dead_at,
                       count(*) over (partition by d.endpoint_id order by d.dead_at
                                      range between current row and p_cluster_span following)
                           as c
                  from d) w
         order by w.endpoint_id, w.c desc, w.dead_at asc
    )
    select b.endpoint_id, b.n, b.unrep, b.nopay,
           err.error_class, err.c, st.last_status, st.c,
           b.first_at, b.last_at, b.ff, b.att, b.auth_n, b.rl_n, cl.c, cl.start, b.hours,
           array_remove(array[
               case when cl.c >= p_cluster_min and cl.c >= p_cluster_share * b.n
                    then 'clustered outage' end,
               case when b.auth_n >= p_spike_min and b.auth_n > p_spike_share * b.n
                    then 'auth/permission spike' end,
               case when b.rl_n >= p_spike_min and b.rl_n > p_spike_share * b.n
                    then 'rate-limit spike' end,
               case when b.hours >= p_gradual_hours
                    then 'gradual accumulation' end
           ], null)
      from base b
      join err on err.endpoint_id = b.endpoint_id
      join st on st.endpoint_id = b.endpoint_id
      join cl on cl.endpoint_id = b.endpoint_id
     order by b.n desc, b.endpoint_id;
end
$$;

-- ==== Alerts ====
-- One row per firing alert; no row = all clear (sluicectl alerts exits 3 when any row comes
-- back, for cron and monitoring):
--   dead_letters_rising   dead letters of the last hour (dead_at >= now - 1 h) >=
--                         p_dead_rise_min (5) AND > p_dead_rise_factor (2) x the hourly average
--                         of the 24 hours before it (dead_at in [now - 25 h, now - 1 h), / 24).
--                         value = last hour's count, threshold = factor x average.
--   oldest_undelivered    the oldest delivery not in a final state was created more than
--                         p_oldest_max (30 min) ago. value / threshold in seconds.
--   slow_endpoint         one row per endpoint of sluice_slow_endpoints(p_slow_threshold_ms
--                         (2000), p_slow_min_samples (20), p_slow_window (24 h)). value = P95
--                         in ms, threshold = p_slow_threshold_ms.
create or replace function sluice_alerts(
    p_dead_rise_factor   double precision default 2.0,
    p_dead_rise_min      bigint default 5,
    p_oldest_max         interval default interval '30 minutes',
    p_slow_threshold_ms  double precision default 2000,
    p_slow_min_samples   bigint default 20,
    p_slow_window        interval default interval '24 hours')
returns table (
    alert        text,
    endpoint_id  text,
    value        double precision,
    threshold    double precision,
    message      text
) language plpgsql stable as $$
declare
    v_now timestamptz := now();
    v_last bigint;
    v_prev bigint;
    v_oldest timestamptz;
begin
    perform sluice__check_window('p_oldest_max', p_oldest_max);
    if p_dead_rise_factor is null or p_dead_rise_factor < 0 then
        raise exception 'p_dead_rise_factor must be >= 0' using errcode = '22023';
    end if;
    if p_dead_rise_min is null or p_dead_rise_min < 1 then
        raise exception 'p_dead_rise_min must be >= 1' using errcode = '22023';
    end if;
    select count(*) filter (where x.dead_at >= v_now - interval '1 hour'),
           count(*) filter (where x.dead_at < v_now - interval '1 hour')
      into v_last, v_prev
      from dead_letters x
     where x.dead_at >= v_now - interval '25 hours';
    if v_last >= p_dead_rise_min and v_last > p_dead_rise_factor * (v_prev / 24.0) then
        alert := 'dead_letters_rising';
        endpoint_id := null;
        value := v_last;
        threshold := p_dead_rise_factor * (v_prev / 24.0);
        message := format('%s dead letters in the last hour; the 24 hours before averaged '
                          '%s per hour (fires above %s x that, and at %s or more)',
                          v_last, round(v_prev / 24.0, 2), p_dead_rise_factor, p_dead_rise_min);
        return next;
    end if;
    select min(d.created_at) into v_oldest
      from deliveries d
     where d.state in ('retry_scheduled', 'deferred');
    if v_oldest is not null and v_now - v_oldest > p_oldest_max then
        alert := 'oldest_undelivered';
        endpoint_id := null;
        value := extract(epoch from (v_now - v_oldest));
        threshold := extract(epoch from p_oldest_max);
        message := format('the oldest undelivered delivery was created %s s ago (limit %s s)',
                          round(value::numeric), round(threshold::numeric));
        return next;
    end if;
    return query
    select 'slow_endpoint'::text, s.endpoint_id, s.p95_ms, p_slow_threshold_ms,
           format('P95 latency %s ms over %s samples (limit %s ms)', round(s.p95_ms::numeric),
                  s.samples, p_slow_threshold_ms)
      from sluice_slow_endpoints(p_slow_threshold_ms, p_slow_min_samples, p_slow_window) s;
end
$$;

-- ==== Latency of one endpoint ====
-- Histogram buckets (upper bounds exclusive): <10 ms, <50, <100, <250, <500, <1 s, <2 s, <5 s,
-- <10 s, >=10 s. sluice_latency_bucket gives a sample's bucket (0..9).
create or replace function sluice_latency_bucket(p_latency_us bigint)
returns integer language sql immutable parallel safe as $$
    select width_bucket(p_latency_us,
                        array[10000, 50000, 100000, 250000, 500000, 1000000, 2000000, 5000000,
                              10000000]::bigint[])
$$;

create or replace function sluice_latency_bucket_labels()
returns text[] language sql immutable parallel safe as $$
    select array['<10ms', '<50ms', '<100ms', '<250ms', '<500ms', '<1s', '<2s', '<5s', '<10s',
                 '>=10s']
$$;

-- One row (samples = 0 and NULL statistics when the window holds no sample): P50/P95/P99,
-- average, min and max in ms, and the histogram as two parallel arrays (bucket labels and
-- counts, always 10 entries).
create or replace function sluice_latency(p_endpoint text,
                                          p_window interval default interval '24 hours')
returns table (
    endpoint_id    text,
    samples        bigint,
    p50_ms         double precision,
    p95_ms         double precision,
    p99_ms         double precision,
    avg_ms         double precision,
    min_ms         double precision,
    max_ms         double precision,
    bucket_labels  text[],
    bucket_counts  bigint[]
) language plpgsql stable as $$
begin
    perform sluice__check_window('p_window', p_window);
    if p_endpoint is null then
        raise exception 'p_endpoint must not be null' using errcode = '22023';
    end if;
    return query
    with s as (
        select l.latency_us from endpoint_latency l
         where l.endpoint_id = p_endpoint and l.ts >= now() - p_window
    ), st as (
        select count(*) as n,
               percentile_cont(array[0.5, 0.95, 0.99]) within group (order by s.latency_us) as p,
               avg(s.latency_us) as a, min(s.latency_us) as mn, max(s.latency_us) as mx
          from s
    ), h as (
        select array_agg(coalesce(c.n, 0) order by b.i) as counts
          from generate_series(0, 9) as b(i)
          left join (select sluice_latency_bucket(s.latency_us) as i, count(*) as n
                       from s group by 1) c on c.i = b.i
    )
    select p_endpoint, st.n, st.p[1] / 1000, st.p[2] / 1000, st.p[3] / 1000,
           st.a::float8 / 1000, st.mn::float8 / 1000, st.mx::float8 / 1000,
           sluice_latency_bucket_labels(), h.counts
      from st, h;
end
$$;

-- The histogram of sluice_latency, one row per bucket: [lo_ms, hi_ms) (hi_ms NULL for the last).
create or replace function sluice_latency_histogram(p_endpoint text,
                                                    p_window interval default interval '24 hours')
returns table (bucket integer, label text, lo_ms double precision, hi_ms double precision,
               samples bigint)
language sql stable as $$
    select b.i, l.labels[b.i + 1],
           (array[0, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000]::float8[])[b.i + 1],
           (array[10, 50, 100, 250, 500, 1000, 2000, 5000, 10000, null]::float8[])[b.i + 1],
           x.bucket_counts[b.i + 1]
      from sluice_latency(p_endpoint, p_window) x,
           lateral (select sluice_latency_bucket_labels() as labels) l,
           generate_series(0, 9) as b(i)
     order by b.i
$$;

-- ==== Replay journal ====
-- `sluicectl replay` re-publishes dead letters to the deliveries topic and marks them replayed
-- (dead_letters.replayed_at, replay_count). Kafka and PostgreSQL cannot commit together, so
-- the marking is made crash-safe with this journal, written on a second connection in
-- autocommit while the first holds the dead_letters rows FOR UPDATE:
--   1. A: BEGIN; SELECT ... FROM dead_letters WHERE replayed_at IS NULL ... FOR UPDATE SKIP
--      LOCKED (concurrent runs skip each other's rows);
--   2. B: INSERT one 'sending' row per selected letter (committed BEFORE anything is sent);
--   3. publish every record and wait for each acknowledgement (acks=all, idempotent producer);
--   4. B: UPDATE the acknowledged ones to 'acked' (committed as soon as the acks are in), the
--      failed ones to 'failed';
--   5. A: UPDATE dead_letters SET replayed_at, replay_count + 1 for the acknowledged; COMMIT.
-- A crash (or lost connection) before 5 rolls A back: the rows are unlocked and unmarked.
-- The next run first calls sluice_replay_recover(), which marks every letter whose journal
-- says 'acked' for its current death, so acknowledged records are never sent twice. Only a
-- crash in the window between Kafka's acknowledgement and the commit of step 4 (milliseconds)
-- leaves a letter 'sending' although Kafka has it: such letters are unmarked and are sent again
-- by the next run (at-least-once). The journal also answers "who replayed what, when".
create table if not exists replay_log (
    run_id       text not null,               -- one sluicectl replay run (128-bit random hex)
    event_id     text not null,
    endpoint_id  text not null,
    dead_at      timestamptz not null,        -- dead_letters.dead_at of the death replayed
    state        text not null check (state in ('sending', 'acked', 'failed')),
    started_at   timestamptz not null default now(), -- when the 'sending' row was written
    acked_at     timestamptz,                 -- when Kafka's acknowledgement was recorded
    error        text,                        -- why the publish failed ('failed' only)
    primary key (run_id, event_id, endpoint_id)
);
create index if not exists replay_log_key_idx on replay_log (event_id, endpoint_id, dead_at);
create index if not exists replay_log_started_idx on replay_log (started_at);

comment on table replay_log is
    'journal of sluicectl replay: one row per (run, dead letter); acked rows make a re-run after '
    'a crash mark instead of re-sending';

-- Mark replayed every unreplayed dead letter whose current death has an 'acked' journal row
-- (a run acknowledged by Kafka that could not commit its marking). Rows locked by a running
-- replay are skipped (that run marks them itself). Returns the number of letters marked.
create or replace function sluice_replay_recover()
returns bigint language sql as $$
    with c as (
        select d.event_id, d.endpoint_id,
               (select max(l.acked_at) from replay_log l
                 where l.event_id = d.event_id and l.endpoint_id = d.endpoint_id
                   and l.dead_at = d.dead_at and l.state = 'acked') as acked_at
          from dead_letters d
         where d.replayed_at is null
           and exists (select 1 from replay_log l
                        where l.event_id = d.event_id and l.endpoint_id = d.endpoint_id
                          and l.dead_at = d.dead_at and l.state = 'acked')
           for update of d skip locked
    ), m as (
        update dead_letters d
           set replayed_at = c.acked_at, replay_count = d.replay_count + 1
          from c
         where d.event_id = c.event_id and d.endpoint_id = c.endpoint_id
        returning 1
    )
    select count(*) from m
$$;

-- Batched retention of the journal (rows started more than p_days ago; the recorder's
-- dead_letter_retention_d is the natural value). Returns rows deleted (repeat while = p_limit).
create or replace function sluice_purge_replay_log(p_days integer, p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select run_id, event_id, endpoint_id from replay_log
         where started_at < now() - make_interval(days => p_days)
         order by started_at
         limit p_limit
    ), gone as (
        delete from replay_log r using victims v
         where r.run_id = v.run_id and r.event_id = v.event_id and r.endpoint_id = v.endpoint_id
        returning 1
    )
    select count(*) from gone
$$;

-- ==== Payloads of open retries (for `sluicectl retries rebuild`) ====
-- The history keeps the original delivery record only for dead letters (the outcome's env).
-- To rebuild the Redis retry schedule after a Redis loss, the record of every OPEN delivery
-- (latest state retry_scheduled or deferred) is needed too. This table holds it, one row per
-- (event, endpoint), once outcomes of those states carry env (a contract change: env allowed
-- on retry_scheduled and deferred, at least on the first one of each delivery, the one that
-- moves it from Kafka into the Redis schedule). The recorder writes it in the batch
-- transaction from its staging rows, newest outcome first:
--   insert into pending_payloads as p (event_id, endpoint_id, payload, attempt, ts)
--   select distinct on (event_id, endpoint_id) event_id, endpoint_id, env, attempt, ts
--     from rec_stage
--    where state in ('retry_scheduled', 'deferred') and env is not null and endpoint_id <> ''
--    order by event_id, endpoint_id, ts desc
--   on conflict (event_id, endpoint_id) do update
--      set payload = excluded.payload, attempt = excluded.attempt, ts = excluded.ts,
--          recorded_at = now()
--    where excluded.ts > p.ts;
-- and calls sluice_purge_pending_payloads() periodically. Until then the table stays empty and
-- rebuild falls back to reading the records from the deliveries topic (see
-- docs/OPERATIONS-analysis.md). Like dead_letters.payload it may hold personal data: readable
-- only by sluice_replay (and the owner).
create table if not exists pending_payloads (
    event_id     text not null,
    endpoint_id  text not null,
    payload      bytea not null,             -- delivery record (msgpack) as the consumer held it
    attempt      bigint not null,            -- the outcome's attempt (0 for deferrals)
    ts           timestamptz not null,       -- ts of the outcome that carried it
    recorded_at  timestamptz not null default now(),
    primary key (event_id, endpoint_id)
);
revoke all on pending_payloads from public;
grant select on pending_payloads to sluice_replay;
revoke all on replay_log from public;
grant select, insert, update on replay_log to sluice_replay;

comment on table pending_payloads is
    'original delivery records of open retries (retry_scheduled / deferred), for rebuilding the '
    'Redis schedule; rows of finished deliveries are removed by sluice_purge_pending_payloads';

-- Delete up to p_limit payloads whose delivery is no longer open (final state, or the
-- deliveries row is gone). Returns rows deleted (repeat while = p_limit).
create or replace function sluice_purge_pending_payloads(p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select p.event_id, p.endpoint_id from pending_payloads p
          left join deliveries d on d.event_id = p.event_id and d.endpoint_id = p.endpoint_id
         where d.state is null or d.state not in ('retry_scheduled', 'deferred')
         limit p_limit
    ), gone as (
        delete from pending_payloads p using victims v
         where p.event_id = v.event_id and p.endpoint_id = v.endpoint_id
        returning 1
    )
    select count(*) from gone
$$;
