#include "tycho/arena.h"

#include "tycho/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 16u

struct arena_block {
    struct arena_block *next;
    size_t cap; /* bytes usable after the header */
    size_t off;
    _Alignas(16) unsigned char data[];
};

struct ty_arena {
    struct arena_block *head; /* current block; older blocks follow via next */
    size_t block_size;
    size_t used;
};

static struct arena_block *block_new(size_t cap)
{
    struct arena_block *b = malloc(sizeof(*b) + cap);
    if (!b)
        return NULL;
    b->next = NULL;
    b->cap = cap;
    b->off = 0;
    return b;
}

ty_arena_t *ty_arena_new(size_t block_size)
{
    ty_arena_t *a = malloc(sizeof(*a));
    if (!a)
        abort();
    a->block_size = block_size ? block_size : 16384;
    a->head = block_new(a->block_size);
    if (!a->head)
        abort();
    a->used = 0;
    return a;
}

void ty_arena_free(ty_arena_t *a)
{
    if (!a)
        return;
    struct arena_block *b = a->head;
    while (b) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(a);
}

void ty_arena_reset(ty_arena_t *a)
{
    /* Keep the oldest block (the one of block_size); free the rest. */
    struct arena_block *b = a->head;
    while (b->next) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    b->off = 0;
    a->head = b;
    a->used = 0;
}

void *ty_arena_try_alloc(ty_arena_t *a, size_t size)
{
    if (size > SIZE_MAX - ARENA_ALIGN)
        return NULL;
    size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0)
        need = ARENA_ALIGN;
    struct arena_block *b = a->head;
    if (b->cap - b->off < need) {
        /* Large requests get a block of their own so the block size stays the common case. */
        size_t cap = need > a->block_size / 4 ? need : a->block_size;
        struct arena_block *nb = block_new(cap);
        if (!nb)
            return NULL;
        if (cap == need && b->off < b->cap / 2) {
            /* Keep filling the current block: link the big one behind it. */
            nb->next = b->next;
            b->next = nb;
            nb->off = need;
            a->used += need;
            return nb->data;
        }
        nb->next = b;
        a->head = nb;
        b = nb;
    }
    void *p = b->data + b->off;
    b->off += need;
    a->used += need;
    return p;
}

void *ty_arena_alloc(ty_arena_t *a, size_t size)
{
    void *p = ty_arena_try_alloc(a, size);
    if (!p) {
        fprintf(stderr, "tycho: arena: out of memory allocating %zu bytes\n", size);
        abort();
    }
    return p;
}

void *ty_arena_calloc(ty_arena_t *a, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = ty_arena_alloc(a, n * size);
    memset(p, 0, n * size);
    return p;
}

char *ty_arena_strndup(ty_arena_t *a, const char *s, size_t n)
{
    char *d = ty_arena_alloc(a, n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *ty_arena_strdup(ty_arena_t *a, const char *s)
{
    return ty_arena_strndup(a, s, strlen(s));
}

size_t ty_arena_used(const ty_arena_t *a)
{
    return a->used;
}
