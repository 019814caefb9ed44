-- The batched purges delete only the row version they chose.
--
-- sluice_purge_dead_letters and sluice_purge_pending_payloads pick their victims in a CTE,
-- then delete by key. Under READ COMMITTED a row that another transaction changed after the
-- pick is re-checked by PostgreSQL against the DELETE's own conditions only, which were the
-- key: a letter that died again (the recorder wrote a new dead_at and payload) or a payload a
-- new retry replaced while the purge ran was deleted with it. Each DELETE now also requires
-- the values the pick saw (dead_at; ts and attempt), so such a row is left for the next pass.

create or replace function sluice_purge_dead_letters(p_days integer, p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select event_id, endpoint_id, dead_at from dead_letters
         where dead_at < now() - make_interval(days => p_days)
         order by dead_at
         limit p_limit
    ), gone as (
        delete from dead_letters d using victims v
         where d.event_id = v.event_id and d.endpoint_id = v.endpoint_id
           and d.dead_at = v.dead_at
        returning 1
    )
    select count(*) from gone
$$;

create or replace function sluice_purge_pending_payloads(p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select p.event_id, p.endpoint_id, p.ts, p.attempt from pending_payloads p
          left join deliveries d on d.event_id = p.event_id and d.endpoint_id = p.endpoint_id
         where d.state is null or d.state not in ('retry_scheduled', 'deferred')
         limit p_limit
    ), gone as (
        delete from pending_payloads p using victims v
         where p.event_id = v.event_id and p.endpoint_id = v.endpoint_id
           and p.ts = v.ts and p.attempt = v.attempt
        returning 1
    )
    select count(*) from gone
$$;
