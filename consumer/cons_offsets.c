/*
 * cons_offsets: per-partition rings of (offset, done) in arrival order (see cons_offsets.h).
 * A slot is addressed by its arrival sequence: index = seq - head_seq within the ring.
 *
 * Invariants checked with SL_ASSERT (common/sl_assert.h): within one generation offsets are
 * tracked in increasing order, a message is finished once, and the offset handed out for
 * commit never goes back (invariant 1: a commit never un-does a durable fate's coverage).
 */
#include "consumer/cons_offsets.h"

#include <stdlib.h>
#include <string.h>

#include "common/sl_assert.h"
#include "common/sl_mem.h"

struct slot {
    int64_t offset; /* Kafka offset */
    bool done;      /* fate durable */
};

struct part {
    bool assigned;        /* currently ours */
    uint64_t generation;  /* bumps on every assign */
    struct slot *ring;    /* capacity cap, power of two */
    uint64_t cap;         /* slots allocated */
    uint64_t head_seq;    /* seq of the oldest tracked slot */
    uint64_t tail_seq;    /* seq the next message gets */
    int64_t next_after;   /* offset after the last message popped (-1 = none yet) */
    int64_t last_stored;  /* last value returned by committable (-1 = none) */
    int64_t last_tracked; /* offset of the last message tracked (-1 = none) */
};

struct cons_offsets {
    struct part *parts; /* indexed by partition */
    int32_t nparts;     /* entries allocated */
    uint64_t gen;       /* generation counter */
};

cons_offsets_t *cons_offsets_new(void)
{
    return sl_xcalloc(1, sizeof(struct cons_offsets));
}

void cons_offsets_destroy(cons_offsets_t *o)
{
    if (!o)
        return;
    for (int32_t i = 0; i < o->nparts; i++)
        free(o->parts[i].ring);
    free(o->parts);
    free(o);
}

static struct part *get_part(cons_offsets_t *o, int32_t p, bool create)
{
    if (p < 0 || p >= CONS_OFFSETS_MAX_PARTITIONS)
        return NULL;
    if (p >= o->nparts) {
        if (!create)
            return NULL;
        int32_t n = p + 1;
        o->parts = sl_xrealloc(o->parts, (size_t)n * sizeof(*o->parts));
        memset(o->parts + o->nparts, 0, (size_t)(n - o->nparts) * sizeof(*o->parts));
        o->nparts = n;
    }
    return &o->parts[p];
}

bool cons_offsets_assign(cons_offsets_t *o, int32_t partition)
{
    struct part *pt = get_part(o, partition, true);
    if (!pt)
        return false;
    free(pt->ring);
    memset(pt, 0, sizeof(*pt));
    pt->assigned = true;
    pt->generation = ++o->gen;
    pt->next_after = -1;
    pt->last_stored = -1;
    pt->last_tracked = -1;
    return true;
}

void cons_offsets_revoke(cons_offsets_t *o, int32_t partition)
{
    struct part *pt = get_part(o, partition, false);
    if (!pt)
        return;
    free(pt->ring);
    pt->ring = NULL;
    pt->cap = 0;
    pt->head_seq = pt->tail_seq = 0;
    pt->assigned = false;
    pt->generation = ++o->gen; /* invalidates every outstanding ref */
}

bool cons_offsets_current(const cons_offsets_t *o, const struct cons_offset_ref *ref)
{
    if (ref->partition < 0 || ref->partition >= o->nparts)
        return false;
    const struct part *pt = &o->parts[ref->partition];
    return pt->assigned && pt->generation == ref->generation;
}

bool cons_offsets_track(cons_offsets_t *o,
                        int32_t partition,
                        int64_t offset,
                        struct cons_offset_ref *ref)
{
    struct part *pt = get_part(o, partition, false);
    if (!pt || !pt->assigned)
        return false;
    SL_ASSERT(offset > pt->last_tracked, "partition %d: offset %lld tracked after %lld",
              (int)partition, (long long)offset, (long long)pt->last_tracked);
    pt->last_tracked = offset;
    uint64_t used = pt->tail_seq - pt->head_seq;
    SL_ASSERT(used <= pt->cap, "partition %d: %llu slots used of %llu", (int)partition,
              (unsigned long long)used, (unsigned long long)pt->cap);
    if (used == pt->cap) {
        uint64_t ncap = pt->cap ? pt->cap * 2 : 1024;
        struct slot *nr = sl_xmalloc(ncap * sizeof(*nr));
        for (uint64_t s = pt->head_seq; s < pt->tail_seq; s++)
            nr[s & (ncap - 1)] = pt->ring[s & (pt->cap - 1)];
        free(pt->ring);
        pt->ring = nr;
        pt->cap = ncap;
    }
    struct slot *sl = &pt->ring[pt->tail_seq & (pt->cap - 1)];
    sl->offset = offset;
    sl->done = false;
    ref->partition = partition;
    ref->generation = pt->generation;
    ref->seq = pt->tail_seq++;
    return true;
}

void cons_offsets_finish(cons_offsets_t *o, const struct cons_offset_ref *ref)
{
    if (!cons_offsets_current(o, ref))
        return;
    struct part *pt = &o->parts[ref->partition];
    if (ref->seq < pt->head_seq || ref->seq >= pt->tail_seq)
        return;
    SL_ASSERT(!pt->ring[ref->seq & (pt->cap - 1)].done,
              "partition %d: message seq %llu (offset %lld) finished twice", (int)ref->partition,
              (unsigned long long)ref->seq, (long long)pt->ring[ref->seq & (pt->cap - 1)].offset);
    pt->ring[ref->seq & (pt->cap - 1)].done = true;
    while (pt->head_seq < pt->tail_seq && pt->ring[pt->head_seq & (pt->cap - 1)].done) {
        pt->next_after = pt->ring[pt->head_seq & (pt->cap - 1)].offset + 1;
        pt->head_seq++;
    }
}

int64_t cons_offsets_committable(cons_offsets_t *o, int32_t partition, uint64_t *pending)
{
    struct part *pt = get_part(o, partition, false);
    if (!pt || !pt->assigned) {
        if (pending)
            *pending = 0;
        return -1;
    }
    if (pending)
        *pending = pt->tail_seq - pt->head_seq;
    /* Lowest unfinished offset bounds the commit; with nothing unfinished, the offset after
     * the last finished message. */
    int64_t off = pt->head_seq < pt->tail_seq ? pt->ring[pt->head_seq & (pt->cap - 1)].offset
                                              : pt->next_after;
    if (off < 0 || off == pt->last_stored)
        return -1;
    SL_ASSERT(off > pt->last_stored, "partition %d: commit offset %lld after %lld", (int)partition,
              (long long)off, (long long)pt->last_stored);
    /* The head slot itself is unfinished: storing its offset means "resume here". */
    pt->last_stored = off;
    return off;
}

int cons_offsets_partitions(const cons_offsets_t *o, int32_t *out, int max)
{
    int n = 0;
    for (int32_t i = 0; i < o->nparts && n < max; i++) {
        if (o->parts[i].assigned)
            out[n++] = i;
    }
    return n;
}

int cons_offsets_span(const cons_offsets_t *o)
{
    return (int)o->nparts;
}

uint64_t cons_offsets_pending(const cons_offsets_t *o)
{
    uint64_t n = 0;
    for (int32_t i = 0; i < o->nparts; i++) {
        if (o->parts[i].assigned)
            n += o->parts[i].tail_seq - o->parts[i].head_seq;
    }
    return n;
}
