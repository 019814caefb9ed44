-- The statistics refresh locks endpoint_health rows in key order in both of its statements.
--
-- Its upsert ran in endpoint_id order, as the recorder's writers lock those rows, but its
-- second statement (endpoints without samples in the window) updated rows in heap order, so a
-- refresh and a writer could deadlock (PostgreSQL breaks it; the write is retried, the refresh
-- runs again at its next tick). The rows are now locked in key order first. A percentile is
-- also kept inside bigint before rounding: one sample near 2^63 µs (the recorder refuses a
-- timing over a day now, but older rows may hold one) failed every refresh until it left the
-- window.

create or replace function sluice_refresh_endpoint_health(p_window_hours integer default 24)
returns integer language plpgsql set work_mem = '128MB' as $$
declare
    v_now timestamptz := now();
    v_n integer;
    v_max constant double precision := 9.2e18;  -- below 2^63 once rounded
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
    select endpoint_id, p_window_hours, n, round(least(p[1], v_max))::bigint,
           round(least(p[2], v_max))::bigint, round(least(p[3], v_max))::bigint,
           round(least(a, v_max::numeric))::bigint, v_now, v_now
      from s
     order by endpoint_id  -- the recorder's writers lock endpoint_health rows in this order too
    on conflict (endpoint_id) do update
       set window_hours = excluded.window_hours, samples = excluded.samples,
           p50_us = excluded.p50_us, p95_us = excluded.p95_us, p99_us = excluded.p99_us,
           avg_us = excluded.avg_us, stats_at = excluded.stats_at, updated_at = excluded.updated_at;
    get diagnostics v_n = row_count;
    update endpoint_health h
       set window_hours = p_window_hours, samples = 0, p50_us = null, p95_us = null,
           p99_us = null, avg_us = null, stats_at = v_now, updated_at = v_now
      from (select endpoint_id from endpoint_health
             where stats_at is distinct from v_now
               and (samples <> 0 or stats_at is null
                    or window_hours is distinct from p_window_hours)
             order by endpoint_id
               for update) v
     where h.endpoint_id = v.endpoint_id;
    return v_n;
end
$$;
