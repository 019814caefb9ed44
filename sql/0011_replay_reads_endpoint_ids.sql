-- A replay sends only the dead letters of endpoints still in the registry.
--
-- A dead letter of an endpoint deleted since cannot be delivered: re-published, the consumers
-- would set it aside as a record for an unknown endpoint (quarantine), and the letter, marked
-- replayed, would no longer be selectable. So the replay's selection (common/sl_replay.c)
-- keeps only letters whose endpoint is registered, and counts the others as `unregistered`:
-- they stay as they are, to be replayed once the endpoint is registered again. The role that
-- replays (sluice_replay) reads the endpoints' ids for that, and nothing else of the registry
-- (its URLs and headers may hold credentials).

grant select (id) on endpoints to sluice_replay;
