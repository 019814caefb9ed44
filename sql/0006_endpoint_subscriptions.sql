-- Event-type subscriptions and channel labels of endpoints (HTTP fan-out: an event published
-- without an explicit endpoint goes to every enabled endpoint whose filter and channels match;
-- common/sl_endpoints.h sl_endpoint_subscribed has the rule).
--   event_types: exact event types and "prefix.*" wildcards; '{}' = every type.
--   channels:    labels such as a tenant or an affiliate id; '{}' = no channel restriction.
-- Both are carried in the endpoint record as "types" / "channels" (schemas/README.md), written
-- only when non-empty, so existing endpoints publish byte-identical records. sluicectl (and
-- sl_registry) validate the entries; the checks here bound the counts only.
alter table endpoints
    add column event_types text[] not null default '{}'
        check (cardinality(event_types) <= 64 and array_position(event_types, null) is null),
    add column channels text[] not null default '{}'
        check (cardinality(channels) <= 16 and array_position(channels, null) is null);

-- Not secret: analysis roles may read them like the other non-secret columns.
grant select (event_types, channels) on endpoints to sluice_analyst;
