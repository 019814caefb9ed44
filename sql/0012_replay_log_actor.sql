-- The replay journal says who replayed.
--
-- replay_log answered "what was replayed, when" but not by whom. Each row now carries the
-- run's actor: "sluicectl <user>@<host>" (the operating-system user and host that ran
-- `sluicectl replay`) or "sluice-api key <id>" (the API key of POST /v1/dead-letters/replay,
-- its id, never the key). Rows written before this migration have ''.

alter table replay_log
    add column if not exists actor text not null default '' check (length(actor) <= 256);
