/*
 * cons_offsets: contiguous offset tracking per partition (invariant 1).
 *
 * Messages of one partition arrive in offset order but finish in any order (a fast
 * endpoint's delivery completes before a slow one's). The offset that may be stored for
 * commit is the lowest unfinished one: everything below it has a durable fate. Each
 * partition keeps a ring of (offset, done) in arrival order; finishing marks a slot, and the
 * head advances over finished slots.
 *
 * A partition's tracker is replaced on every assignment (generation), so a job that finishes
 * after its partition was revoked cannot move the new owner's offsets.
 *
 * thread: consumer main loop only.
 */
#ifndef CONS_OFFSETS_H
#define CONS_OFFSETS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cons_offsets cons_offsets_t;

/* A handle to one tracked message, kept by its job. */
struct cons_offset_ref {
    int32_t partition;   /* Kafka partition */
    uint64_t generation; /* tracker generation the message belongs to */
    uint64_t seq;        /* arrival sequence within that generation */
};

cons_offsets_t *cons_offsets_new(void);
void cons_offsets_destroy(cons_offsets_t *o);

/* Partition ids tracked: 0 .. CONS_OFFSETS_MAX_PARTITIONS - 1 (Kafka numbers a topic's
 * partitions densely from 0; one entry per id up to the highest assigned, 64 bytes each). */
#define CONS_OFFSETS_MAX_PARTITIONS (1 << 20)

/* Start tracking a partition (on assignment): a fresh generation. False when the partition id
 * is outside 0 .. CONS_OFFSETS_MAX_PARTITIONS - 1 (nothing tracked: the caller must say so). */
bool cons_offsets_assign(cons_offsets_t *o, int32_t partition);
/* Stop tracking (on revoke); later finishes for it are ignored. */
void cons_offsets_revoke(cons_offsets_t *o, int32_t partition);
/* Is the partition assigned in the generation of ref? */
bool cons_offsets_current(const cons_offsets_t *o, const struct cons_offset_ref *ref);

/* Record a received message; fills ref. Returns false if the partition is not assigned. */
bool cons_offsets_track(cons_offsets_t *o,
                        int32_t partition,
                        int64_t offset,
                        struct cons_offset_ref *ref);
/* Mark a message finished (its fate is durable). Stale refs are ignored. */
void cons_offsets_finish(cons_offsets_t *o, const struct cons_offset_ref *ref);

/*
 * The offset to store for partition (next offset to consume: lowest unfinished, or last
 * finished + 1), or -1 when nothing new since the last call that returned it. Sets *pending
 * to the number of unfinished messages (optional).
 */
int64_t cons_offsets_committable(cons_offsets_t *o, int32_t partition, uint64_t *pending);

/* Partitions currently assigned: fills up to max into out, returns the count. */
int cons_offsets_partitions(const cons_offsets_t *o, int32_t *out, int max);
/* An upper bound of the assigned partitions' count (size for cons_offsets_partitions). */
int cons_offsets_span(const cons_offsets_t *o);

/* Unfinished messages across all partitions. */
uint64_t cons_offsets_pending(const cons_offsets_t *o);

#endif /* CONS_OFFSETS_H */
