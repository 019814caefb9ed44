-- API keys of the HTTP API server sluice-api (common/sl_apikey.h, `sluicectl keys ...`).
--
-- A key is presented as "slk_<id>_<secret>": id = 16 characters [a-z0-9] (this table's key,
-- not secret), secret = 43 characters of unpadded base64url encoding 32 random bytes
-- (RAND_bytes). Only hash = SHA-256 of those 32 secret bytes is stored: the key itself is
-- shown once by `sluicectl keys create` and exists nowhere else. sluice-api compares hashes
-- in constant time.
--
-- Revocation sets revoked_at (rows are never deleted, so the history of who had which key
-- stays); sluice-api caches the keys in memory and reloads them every api_key_refresh_ms,
-- so a revocation takes effect within that period. updated_at changes with every change.
--
-- Channel names follow [A-Za-z0-9_.:-]{1,64}, at most 16 per key; an empty list means every
-- channel. Scopes: publish, read, admin (admin implies the other two, in sluice-api).

-- Every element a channel name (a CHECK cannot hold a subquery, so a function does it).
create or replace function sluice__api_key_channels_ok(p_channels text[])
returns boolean language sql immutable as $$
    select coalesce(bool_and(c is not null and c ~ '^[A-Za-z0-9_.:-]{1,64}$'), true)
      from unnest(p_channels) c
$$;

create table if not exists api_keys (
    id           text primary key check (id ~ '^[a-z0-9]{16}$'),
    name         text not null default '' check (octet_length(name) <= 128),
    hash         bytea not null check (octet_length(hash) = 32),   -- SHA-256 of the secret
    scopes       text[] not null
                 check (array_ndims(scopes) = 1 and cardinality(scopes) >= 1
                        and array_position(scopes, null) is null
                        and scopes <@ array['publish', 'read', 'admin']::text[]),
    channels     text[] not null default '{}'
                 check (coalesce(array_ndims(channels), 1) = 1 and cardinality(channels) <= 16
                        and sluice__api_key_channels_ok(channels)),
    rate_per_s   integer not null default 0 check (rate_per_s >= 0),   -- requests/s; 0 = unlimited
    burst        integer not null default 0 check (burst >= 0),        -- bucket size; 0 = rate_per_s
    created_at   timestamptz not null default now(),
    revoked_at   timestamptz null,                                     -- null = active
    updated_at   timestamptz not null default now()
);

comment on table api_keys is
    'API keys of sluice-api: only a SHA-256 of each 256-bit random secret is stored; written by '
    'sluicectl keys create|revoke, read by sluice-api (cached, reloaded every api_key_refresh_ms)';
comment on column api_keys.hash is
    'SHA-256 of the 32 random secret bytes of the key (never the key itself)';
comment on column api_keys.channels is
    'channels the key may use; empty = every channel';
comment on column api_keys.rate_per_s is
    'requests per second for this key in sluice-api (429 with Retry-After above it); 0 = unlimited';
comment on column api_keys.burst is
    'token bucket size of the rate limit; 0 = rate_per_s';

-- ==== Roles ====
-- sluice_api: the API server reads every key (hashes included) to authenticate requests.
-- sluice_analyst (from 0001): sees which keys exist, never their hashes.
-- The sluice user owns the table, so sluicectl keeps full access.
do $$
begin
    if not exists (select 1 from pg_roles where rolname = 'sluice_api') then
        create role sluice_api nologin;
    end if;
    if not exists (select 1 from pg_roles where rolname = 'sluice_analyst') then
        create role sluice_analyst nologin;
    end if;
end
$$;
revoke all on api_keys from public;
grant select on api_keys to sluice_api;
grant select (id, name, scopes, channels, rate_per_s, burst, created_at, revoked_at, updated_at)
    on api_keys to sluice_analyst;
