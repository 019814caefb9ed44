/*
 * sl_record_int.h: sl_record internals shared with sl_jsonl (and unit tests). Not a public
 * contract: only common/sl_record.c, common/sl_jsonl.c and their tests include it.
 *
 * The delivery rules are checked once, in sl__delivery_validate_named(), and reported with the
 * field names of whichever input format the caller parsed: msgpack keys ("ep", "hdr") for
 * records, sluice-produce JSON keys ("endpoint", "headers") for JSON lines.
 */
#ifndef SL_RECORD_INT_H
#define SL_RECORD_INT_H

#include "common/sl_err.h"
#include "common/sl_record.h"

/* Field names used in error messages; all borrowed static strings. */
struct sl__delivery_names {
    const char *id;     /* msgpack "id" */
    const char *ep;     /* msgpack "ep" */
    const char *type;   /* msgpack "type" */
    const char *ct;     /* msgpack "ct" */
    const char *body;   /* msgpack "body" */
    const char *hdr;    /* msgpack "hdr" */
    const char *macros; /* msgpack "macros" */
};

/* The msgpack key names (what sl_delivery_validate uses). */
extern const struct sl__delivery_names sl__delivery_msgpack_names;

/* sl_delivery_validate() with caller-chosen field names (nm borrowed, not NULL). */
int sl__delivery_validate_named(const struct sl_delivery *d,
                                const struct sl_decode_limits *lim,
                                const struct sl__delivery_names *nm,
                                sl_err_t *err);

/* Effective limits after applying defaults to lim (NULL = defaults). */
size_t sl__lim_max_body(const struct sl_decode_limits *lim);
size_t sl__lim_delivery_record(const struct sl_decode_limits *lim);

#endif /* SL_RECORD_INT_H */
