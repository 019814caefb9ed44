-- Endpoint ids in the order of their bytes.
--
-- sluice-api and sluicectl read the endpoints and their secrets ordered by id with
-- collate "C" (the order their merge compares them in) and page through them with
-- `id collate "C" > cursor`. On a database whose default collation is linguistic (en_US and
-- the like, most installations) the primary keys' indexes do not serve that order, and each
-- page would scan and sort the whole table: these indexes do.

create index if not exists endpoints_id_bytes on endpoints (id collate "C");
create index if not exists endpoint_secrets_endpoint_id_bytes
    on endpoint_secrets (endpoint_id collate "C");
