/*
 * rec_db_int.h: rec_db internals shared with its tests (tests/integration/test_rec_paths.c).
 *
 * The endpoint_health inputs of a write come from one of two paths: rec_agg in the recorder
 * (the fast apply of an eligible slice) or the HEALTH_SQL CTEs (the safe apply, and slices near
 * the retention limit). rec_db_set_health pins a handle to one path so a test can write the
 * same batches through both and compare the tables.
 *
 * thread: as rec_db.h (one thread per handle).
 */
#ifndef REC_DB_INT_H
#define REC_DB_INT_H

#include "recorder/rec_db.h"

/*
 * deliveries_replaces(d.state, d.last_update, excluded.state, excluded.last_update) of
 * sql/0002_history.sql, written out for the deliveries upsert: PostgreSQL does not inline the
 * SQL function inside ON CONFLICT (a function call per column and conflicting row was ~4 % of
 * the recorder's PostgreSQL time). test_rec_paths.c compares the two over every pair of states
 * and order of times.
 */
#define REC_DB_REPLACES_SQL                                                                        \
    "(case when d.state = 'delivered'"                                                             \
    "      then excluded.state = 'delivered' and excluded.last_update < d.last_update"             \
    "      when excluded.state = 'delivered' then true"                                            \
    "      else (excluded.last_update, excluded.state) > (d.last_update, d.state) end)"

/* Where a handle's writes take the endpoint_health inputs from. */
enum rec_db_health {
    REC_DB_HEALTH_AUTO = 0, /* production: rec_agg when the fast apply runs an eligible slice */
    REC_DB_HEALTH_SQL,      /* always HEALTH_SQL */
    REC_DB_HEALTH_AGG,      /* rec_agg whenever it can: as AUTO, but every write starts with the
                               fast apply (no run of safe writes after a duplicate) */
};

/* Pin db's writes to one path (default REC_DB_HEALTH_AUTO). */
void rec_db_set_health(rec_db_t *db, enum rec_db_health h);

#endif /* REC_DB_INT_H */
