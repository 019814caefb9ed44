/*
 * prod_lib: the producer library over Sluice's internal types, for Sluice's own programs
 * (sluice-produce, sluice-api, sl-bench, tests). Not installed and not exported from the
 * shared library: applications use sluice_producer.h.
 *
 * These are the public entry points minus the conversions: prod_lib_new takes a
 * configuration sl_cfg already loaded and validated (every process's), prod_lib_publish a
 * struct sl_delivery as the codec and the JSON-lines parser produce it, both with sl_err_t.
 * The returned producer is an ordinary sluice_producer_t: poll, flush, outstanding, fatal,
 * last_error and destroy are the public functions. Error codes are the same values
 * (SL_EINVAL == SLUICE_EINVAL, ...).
 *
 * thread: as in sluice_producer.h.
 */
#ifndef PROD_LIB_H
#define PROD_LIB_H

#include "common/sl_cfg.h"
#include "common/sl_err.h"
#include "common/sl_record.h"
#include "producer/sluice_producer.h"

/*
 * sluice_producer_new_opts for cfg (borrowed, read during the call only; loaded by
 * sl_cfg_load, so its cross-field checks have run). opts NULL = defaults. Returns NULL with
 * err filled (SL_EINVAL for bad opts or an empty topic, SL_EKAFKA when librdkafka refuses the
 * configuration). Leaves the process's logger alone (the caller initialised it).
 */
sluice_producer_t *
prod_lib_new(const struct sl_config *cfg, const struct sluice_producer_opts *opts, sl_err_t *err);

/* sluice_producer_publish for a struct sl_delivery (borrowed; attempt and replay included). */
int prod_lib_publish(sluice_producer_t *p,
                     const struct sl_delivery *d,
                     sluice_done_fn done,
                     void *opaque,
                     sl_err_t *err);

#endif /* PROD_LIB_H */
