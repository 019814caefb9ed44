-- Endpoint registry: the one source of truth for where and how Sluice delivers.
-- Written only by `sluicectl endpoints ...`; every change is also published to the compacted
-- sluice.endpoints topic, which consumers materialise in memory (they never read this table).
-- Numeric policy columns: 0 means "use the global default" from the consumer's config.
-- sluicectl serialises changes with advisory locks (see ctl/README.md): per endpoint
-- pg_advisory_lock(1397507408, hashtext(id)) under a shared pg_advisory_lock(5997849461130),
-- and `endpoints sync` takes the latter exclusively, so the topic receives changes in commit
-- order.

create table endpoints (
    id               text primary key check (id ~ '^[A-Za-z0-9_-]{1,64}$'),
    name             text not null default '' check (length(name) <= 128),
    -- a URL, or a postback template with {macro} placeholders when is_template.
    -- May carry tokens in its query string: never logged, shown only by `endpoints show`.
    url              text not null check (octet_length(url) between 1 and 2048),
    is_template      boolean not null default false,
    method           text not null default 'POST' check (method in ('POST', 'PUT', 'PATCH', 'GET')),
    content_type     text not null default '' check (length(content_type) <= 128),  -- '' = the delivery's
    -- static extra headers, in order: [{"name": "X-Source", "value": "sluice"}, ...]
    -- (values may be credentials: shown only with `endpoints show --show-secrets`)
    headers          jsonb not null default '[]'::jsonb
                     check (jsonb_typeof(headers) = 'array' and jsonb_array_length(headers) <= 32),
    timeout_ms       integer not null default 0 check (timeout_ms >= 0),
    conn_timeout_ms  integer not null default 0 check (conn_timeout_ms >= 0),
    retry_base_ms    bigint not null default 0 check (retry_base_ms between 0 and 4294967295),
    retry_cap_ms     bigint not null default 0 check (retry_cap_ms between 0 and 4294967295),
    max_attempts     integer not null default 0 check (max_attempts between 0 and 100),
    brk_threshold    integer not null default 0 check (brk_threshold >= 0),
    brk_cooldown_ms  bigint not null default 0 check (brk_cooldown_ms between 0 and 4294967295),
    rate             integer not null default 0 check (rate >= 0),   -- tokens per rate_period_ms; 0 = unlimited
    rate_period_ms   bigint not null default 0 check (rate_period_ms between 0 and 4294967295),
    burst            integer not null default 0 check (burst >= 0),
    max_inflight     integer not null default 0 check (max_inflight >= 0),
    enabled          boolean not null default true,
    disabled_reason  text not null default '' check (length(disabled_reason) <= 256),
    created_at       timestamptz not null default now(),
    updated_at       timestamptz not null default now(),   -- the record's "updated" (ms)
    check (retry_base_ms = 0 or retry_cap_ms = 0 or retry_cap_ms >= retry_base_ms)
);

-- Signing secrets: the "whsec_..." text sealed with AES-256-GCM under the master key
-- (common/sl_secretbox.c; associated data = endpoint id); the same bytes go into the topic.
-- expires_at null = the current secret (exactly one per endpoint); a rotation sets the
-- previous current secret's expires_at to now() + overlap so both sign during the overlap.
-- Secrets past expires_at are left out of the topic record and pruned at the next rotation.
create table endpoint_secrets (
    endpoint_id  text not null references endpoints (id) on delete cascade,
    seq          integer not null check (seq >= 1),
    secret_enc   bytea not null check (octet_length(secret_enc) between 1 and 256),
    created_at   timestamptz not null default now(),
    expires_at   timestamptz,
    primary key (endpoint_id, seq)
);
create unique index endpoint_secrets_one_current on endpoint_secrets (endpoint_id)
    where expires_at is null;

-- Only the registry role may read secrets, URLs (query strings carry tokens) and header
-- values; analysis roles see the rest of the registry.
do $$
begin
    if not exists (select 1 from pg_roles where rolname = 'sluice_analyst') then
        create role sluice_analyst nologin;
    end if;
end
$$;
grant select (id, name, is_template, method, content_type, timeout_ms, conn_timeout_ms,
              retry_base_ms, retry_cap_ms, max_attempts, brk_threshold, brk_cooldown_ms, rate,
              rate_period_ms, burst, max_inflight, enabled, disabled_reason, created_at,
              updated_at)
    on endpoints to sluice_analyst;
