-- The dead-letter analysis runs with its owner's rights.
--
-- sluice_dead_letter_analysis counts the letters kept without a payload (`payload is null`),
-- a column sluice_analyst may not read (payloads are personal data). So the role the docs
-- give an API instance serving the delivery log (sluice_api + sluice_analyst) could not call
-- it: GET /v1/dead-letters/patterns failed. As security definer it answers counts and
-- patterns only, never a payload, to whoever may execute it; its search_path is pinned, as a
-- security definer's must be, to the schema the tables live in, pg_temp last.

alter function sluice_dead_letter_analysis(interval, text, interval, double precision, bigint,
                                           double precision, bigint, integer)
    security definer set search_path = public, pg_temp;
