-- Who may run the dead-letter analysis, and one lock order for the statistics refresh.
--
-- sluice_dead_letter_analysis runs with its owner's rights (0013). PostgreSQL lets PUBLIC
-- execute a new function, so any role that can connect would have read per-endpoint
-- dead-letter figures through it, which dead_letters itself refuses to PUBLIC: it is for
-- sluice_analyst (and the owner) only.
--
-- sluice_refresh_endpoint_health (0014) locked the rows of endpoints with samples, then those
-- without, each statement in key order but the two together not: a writer holding a quiet
-- endpoint's row and waiting for a busy one's could deadlock with it. The statistics are now
-- computed first, without a lock, then every row the refresh will change is locked in one
-- ordered pass, then written.

revoke execute on function sluice_dead_letter_analysis(interval, text, interval,
    double precision, bigint, double precision, bigint, integer) from public;
grant execute on function sluice_dead_letter_analysis(interval, text, interval,
    double precision, bigint, double precision, bigint, integer) to sluice_analyst;

create or replace function sluice_refresh_endpoint_health(p_window_hours integer default 24)
returns integer language plpgsql set work_mem = '128MB' as $$
declare
    v_now timestamptz := now();
    v_max constant double precision := 9.2e18;  -- below 2^63 once rounded
    v_ids text[];
    v_n bigint[];
    v_p50 double precision[];
    v_p95 double precision[];
    v_p99 double precision[];
    v_avg double precision[];
begin
    -- 1. the statistics, no row locked yet (the sort of the window's samples is the slow part)
    select coalesce(array_agg(endpoint_id order by endpoint_id), '{}'),
           coalesce(array_agg(n order by endpoint_id), '{}'),
           coalesce(array_agg(least(p[1], v_max) order by endpoint_id), '{}'),
           coalesce(array_agg(least(p[2], v_max) order by endpoint_id), '{}'),
           coalesce(array_agg(least(p[3], v_max) order by endpoint_id), '{}'),
           coalesce(array_agg(least(a, v_max) order by endpoint_id), '{}')
      into v_ids, v_n, v_p50, v_p95, v_p99, v_avg
      from (select endpoint_id, count(*) as n,
                   percentile_cont(array[0.5, 0.95, 0.99])
                       within group (order by latency_us) as p,
                   avg(latency_us)::double precision as a
              from endpoint_latency
             where ts >= v_now - make_interval(hours => p_window_hours)
             group by endpoint_id) s;
    -- 2. every existing row either statement below changes, locked in key order in one pass,
    -- the order the recorder's writers lock them in
    perform 1
       from endpoint_health
      where endpoint_id = any(v_ids)
         or (samples <> 0 or stats_at is null or window_hours is distinct from p_window_hours)
      order by endpoint_id
        for update;
    -- 3. the writes
    insert into endpoint_health as h (endpoint_id, window_hours, samples, p50_us, p95_us, p99_us,
                                      avg_us, stats_at, updated_at)
    select u.id, p_window_hours, u.n, round(u.p50)::bigint, round(u.p95)::bigint,
           round(u.p99)::bigint, round(u.a)::bigint, v_now, v_now
      from unnest(v_ids, v_n, v_p50, v_p95, v_p99, v_avg) as u(id, n, p50, p95, p99, a)
     order by u.id
    on conflict (endpoint_id) do update
       set window_hours = excluded.window_hours, samples = excluded.samples,
           p50_us = excluded.p50_us, p95_us = excluded.p95_us, p99_us = excluded.p99_us,
           avg_us = excluded.avg_us, stats_at = excluded.stats_at, updated_at = excluded.updated_at;
    update endpoint_health
       set window_hours = p_window_hours, samples = 0, p50_us = null, p95_us = null,
           p99_us = null, avg_us = null, stats_at = v_now, updated_at = v_now
     where stats_at is distinct from v_now
       and (samples <> 0 or stats_at is null or window_hours is distinct from p_window_hours);
    return cardinality(v_ids);
end
$$;
