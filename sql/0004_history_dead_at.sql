-- deliveries.last_dead_at: the newest dead_letter outcome of each delivery (NULL = never died),
-- maintained by sluice-recorder as a max aggregate like the other deliveries aggregates.
-- It lets the recorder resolve dead letters (dead_letters.resolved_at) from the deliveries
-- upsert it does anyway: when a batch brings a delivered outcome newer than last_dead_at, the
-- dead letter is resolved, without probing dead_letters for every delivered outcome.
alter table deliveries add column if not exists last_dead_at timestamptz;

comment on column deliveries.last_dead_at is
    'newest dead_letter outcome of this delivery; NULL = never died (sluice-recorder)';

-- Existing histories: the newest death is the dead letter's dead_at.
update deliveries d
   set last_dead_at = x.dead_at
  from dead_letters x
 where x.event_id = d.event_id and x.endpoint_id = d.endpoint_id
   and d.last_dead_at is distinct from greatest(d.last_dead_at, x.dead_at);

comment on function deliveries_replaces(outcome_state, timestamptz, outcome_state, timestamptz) is
    'the "only move forward" rule of deliveries; sluice-recorder writes the same expression out '
    'in its upsert (REC_DB_REPLACES_SQL in recorder/rec_db_int.h), as PostgreSQL does not inline '
    'it inside ON CONFLICT; tests/integration/test_rec_paths.c checks that the two agree';
