-- Retention of deliveries keeps the rows an unresolved dead letter still needs.
--
-- A dead letter is resolved (dead_letters.resolved_at) when the recorder sees the delivery
-- delivered after its death, which it learns from the deliveries row's last_dead_at. With the
-- default retentions (deliveries 14 days, dead letters 30), a dead letter replayed after day
-- 14 found its deliveries row purged: the delivered outcome made a fresh row without
-- last_dead_at, and the dead letter stayed unresolved for good. So a deliveries row is kept
-- while an unresolved dead letter of the same key exists; it goes once the dead letter is
-- resolved (after its own retention) or purged.
create or replace function sluice_purge_deliveries(p_days integer, p_limit integer default 10000)
returns bigint language sql as $$
    with victims as (
        select d.ctid from deliveries d
         where d.last_update < now() - make_interval(days => p_days)
           and not exists (select 1 from dead_letters x
                            where x.event_id = d.event_id and x.endpoint_id = d.endpoint_id
                              and x.resolved_at is null)
         limit p_limit
    ), gone as (
        delete from deliveries where ctid in (select ctid from victims)
        returning 1
    )
    select count(*) from gone
$$;

comment on function sluice_purge_deliveries(integer, integer) is
    'deletes up to p_limit deliveries rows last updated more than p_days ago, except those an '
    'unresolved dead letter still refers to (sluice-recorder retention)';
