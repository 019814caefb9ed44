/*
 * cons_list: the consumer's one intrusive list type (doubly linked, circular, with a sentinel).
 *
 * An object that can sit on a list embeds a struct cons_link per list it can be on, and
 * CONS_CONTAINER turns a link back into its object (libuv's queue.h, curl's llist.c). A link
 * that is on no list has both pointers NULL, so membership is cons_link_linked(), and unlink
 * is O(1) without knowing anything but the list. A list counts its entries. The engine keeps
 * each job on at most one state list at a time (its state names which), plus the lease list.
 *
 * Every list is initialised with cons_list_init before use; all functions are O(1).
 * thread: none of its own; a list belongs to whoever owns the structure it is in.
 */
#ifndef CONS_LIST_H
#define CONS_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "common/sl_assert.h"

struct cons_link {
    struct cons_link *prev, *next; /* neighbours; both NULL when on no list */
};

struct cons_list {
    struct cons_link head; /* sentinel: head.next is the first entry, head.prev the last */
    size_t n;              /* entries */
};

/* The object of type `type` whose member `member` is the link at ptr. */
#define CONS_CONTAINER(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* Iterate l from first to last; `it` (struct cons_link *) may be unlinked in the body,
 * `nx` holds its successor. */
#define CONS_LIST_FOREACH_SAFE(l, it, nx)                                                          \
    for ((it) = (l)->head.next, (nx) = (it)->next; (it) != &(l)->head;                             \
         (it) = (nx), (nx) = (it)->next)

static inline void cons_list_init(struct cons_list *l)
{
    l->head.prev = l->head.next = &l->head;
    l->n = 0;
}

static inline bool cons_list_empty(const struct cons_list *l)
{
    return l->head.next == &l->head;
}

static inline bool cons_link_linked(const struct cons_link *k)
{
    return k->next != NULL;
}

/* The first or last entry, or NULL when empty. */
static inline struct cons_link *cons_list_first(const struct cons_list *l)
{
    return cons_list_empty(l) ? NULL : l->head.next;
}

static inline struct cons_link *cons_list_last(const struct cons_list *l)
{
    return cons_list_empty(l) ? NULL : l->head.prev;
}

static inline void
cons_list_insert_(struct cons_list *l, struct cons_link *prev, struct cons_link *k)
{
    SL_ASSERT(!cons_link_linked(k), "link already on a list");
    k->prev = prev;
    k->next = prev->next;
    prev->next->prev = k;
    prev->next = k;
    l->n++;
}

static inline void cons_list_push_tail(struct cons_list *l, struct cons_link *k)
{
    cons_list_insert_(l, l->head.prev, k);
}

static inline void cons_list_push_head(struct cons_list *l, struct cons_link *k)
{
    cons_list_insert_(l, &l->head, k);
}

/* Remove k, which must be on l. */
static inline void cons_list_unlink(struct cons_list *l, struct cons_link *k)
{
    SL_ASSERT(cons_link_linked(k) && l->n > 0, "link not on a list");
    k->prev->next = k->next;
    k->next->prev = k->prev;
    k->prev = k->next = NULL;
    l->n--;
}

/* Remove and return the first entry, or NULL when empty. */
static inline struct cons_link *cons_list_pop_head(struct cons_list *l)
{
    struct cons_link *k = cons_list_first(l);
    if (k)
        cons_list_unlink(l, k);
    return k;
}

#endif /* CONS_LIST_H */
