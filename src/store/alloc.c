/* Offset allocator: address-ordered free list, first fit, coalescing on give (store_alloc.h). */
#include "tycho/store_alloc.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdbool.h>
#include <stdlib.h>

struct extent {
    uint64_t off, len;
    struct extent *prev, *next;
};

struct ty_store_alloc {
    uint64_t size, align, used;
    struct extent *head; /* free extents, ascending offset, never adjacent */
};

static struct extent *extent_new(uint64_t off, uint64_t len)
{
    struct extent *e = calloc(1, sizeof(*e));
    TY_ASSERT(e != NULL);
    e->off = off;
    e->len = len;
    return e;
}

static void extent_unlink(ty_store_alloc_t *a, struct extent *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        a->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    free(e);
}

int ty_store_alloc_new(ty_store_alloc_t **out, uint64_t size, uint64_t align)
{
    if (align == 0)
        align = 64;
    if ((align & (align - 1)) != 0 || size < align)
        return TY_EINVAL;
    ty_store_alloc_t *a = calloc(1, sizeof(*a));
    TY_ASSERT(a != NULL);
    a->size = size - size % align;
    a->align = align;
    a->head = extent_new(0, a->size);
    *out = a;
    return 0;
}

void ty_store_alloc_free(ty_store_alloc_t *a)
{
    if (!a)
        return;
    struct extent *e = a->head;
    while (e) {
        struct extent *n = e->next;
        free(e);
        e = n;
    }
    free(a);
}

static uint64_t round_up(const ty_store_alloc_t *a, uint64_t len)
{
    return (len + a->align - 1) & ~(a->align - 1);
}

int ty_store_alloc_take(ty_store_alloc_t *a, uint64_t len, uint64_t *offset)
{
    if (len == 0 || len > a->size)
        return len == 0 ? TY_EINVAL : TY_ENOCAPACITY;
    len = round_up(a, len);
    for (struct extent *e = a->head; e; e = e->next) {
        if (e->len < len)
            continue;
        *offset = e->off;
        e->off += len;
        e->len -= len;
        if (e->len == 0)
            extent_unlink(a, e);
        a->used += len;
        return 0;
    }
    return TY_ENOCAPACITY;
}

int ty_store_alloc_take_at(ty_store_alloc_t *a, uint64_t offset, uint64_t len)
{
    if (len == 0 || offset % a->align != 0 || offset >= a->size || len > a->size - offset)
        return TY_EINVAL;
    len = round_up(a, len);
    if (len > a->size - offset)
        return TY_EINVAL;
    for (struct extent *e = a->head; e; e = e->next) {
        if (e->off > offset)
            break;
        if (e->off + e->len < offset + len)
            continue;
        /* [offset, offset+len) lies inside e: split into a left and a right remainder. */
        uint64_t left = offset - e->off, right = e->off + e->len - (offset + len);
        if (left == 0 && right == 0) {
            extent_unlink(a, e);
        } else if (left == 0) {
            e->off = offset + len;
            e->len = right;
        } else {
            e->len = left;
            if (right > 0) {
                struct extent *r = extent_new(offset + len, right);
                r->prev = e;
                r->next = e->next;
                if (e->next)
                    e->next->prev = r;
                e->next = r;
            }
        }
        a->used += len;
        return 0;
    }
    return TY_EBUSY;
}

int ty_store_alloc_give(ty_store_alloc_t *a, uint64_t offset, uint64_t len)
{
    if (len == 0 || offset % a->align != 0 || offset >= a->size)
        return TY_EINVAL;
    len = round_up(a, len);
    if (len > a->size - offset)
        return TY_EINVAL;
    struct extent *prev = NULL, *next = a->head;
    while (next && next->off < offset) {
        prev = next;
        next = next->next;
    }
    if ((prev && prev->off + prev->len > offset) || (next && offset + len > next->off))
        return TY_EINVAL; /* overlaps a free range: a double free */
    bool join_prev = prev && prev->off + prev->len == offset;
    bool join_next = next && offset + len == next->off;
    if (join_prev && join_next) {
        prev->len += len + next->len;
        extent_unlink(a, next);
    } else if (join_prev) {
        prev->len += len;
    } else if (join_next) {
        next->off = offset;
        next->len += len;
    } else {
        struct extent *e = extent_new(offset, len);
        e->prev = prev;
        e->next = next;
        if (prev)
            prev->next = e;
        else
            a->head = e;
        if (next)
            next->prev = e;
    }
    a->used -= len;
    return 0;
}

uint64_t ty_store_alloc_used(const ty_store_alloc_t *a)
{
    return a->used;
}
uint64_t ty_store_alloc_size(const ty_store_alloc_t *a)
{
    return a->size;
}
