-- The history's event and endpoint ids compared as bytes (collate "C"), whatever the
-- database's default collation.
--
-- The ids are ASCII identifiers ([A-Za-z0-9_-] endpoint ids, printable event ids), never text
-- for people to sort. Under a linguistic default collation (en_US.UTF-8 and the like: most
-- installations, and the postgres Docker image of compose.yaml) every comparison of them in a
-- B-tree insertion, a sort or a join goes through the C library's strcoll or ICU. On a glibc
-- en_US.UTF-8 database sluice-recorder wrote 48,031-52,002 outcomes/s with PostgreSQL spending
-- 32.0-33.1 CPU-s per million (ICU en-US: 81,500-92,937/s, 16.6-18.4 CPU-s), against
-- 105,374-110,497/s and 12.9-13.2 CPU-s on a database whose default is C
-- (bench/results/2026-12-05-intel-recorder-collation.txt). With the columns collated "C" the
-- keys compare with memcmp everywhere. Equality is the same under both collations (both are
-- deterministic), so no row, key or answer changes; ORDER BY over these columns returns byte
-- order (upper case before lower case), the order sluice-api and sluicectl already asked for
-- with explicit collate "C" (api/api_history.c, api/api_stats.c), which the keys' indexes now
-- serve.
--
-- What this costs once: the columns keep their bytes (text to text, no table rewrite), but
-- every index over them is rebuilt, under an ACCESS EXCLUSIVE lock on its table: the
-- recorder's writes wait meanwhile (deliveries go on; outcomes wait in Kafka). On a large
-- history, apply it at a quiet hour. Partitions follow their parent; partitions made later
-- (sluice_partition_add, LIKE the parent) take the parent's collation.

alter table delivery_attempts
    alter column event_id type text collate "C",
    alter column endpoint_id type text collate "C";

alter table deliveries
    alter column event_id type text collate "C",
    alter column endpoint_id type text collate "C";

alter table endpoint_latency
    alter column event_id type text collate "C",
    alter column endpoint_id type text collate "C";

alter table endpoint_health
    alter column endpoint_id type text collate "C";

alter table dead_letters
    alter column event_id type text collate "C",
    alter column endpoint_id type text collate "C";

alter table replay_log
    alter column run_id type text collate "C",
    alter column event_id type text collate "C",
    alter column endpoint_id type text collate "C";

alter table pending_payloads
    alter column event_id type text collate "C",
    alter column endpoint_id type text collate "C";
