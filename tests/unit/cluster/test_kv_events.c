/* The KV block event set of a node (tycho/kv_events.h) and the timing ring
 * (tycho/timing_ring.h): coalescing, give-back under newer changes, overflow and resync
 * snapshots, and a producer thread against a consumer that applies (or gives back) batches the
 * way the Conductor's index would. Hashes here are small integers (0 included), so a model of
 * a set is a bool array. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/kv_events.h"
#include "tycho/timing_ring.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define UNIVERSE 1000

/* The Conductor's view of the node: reset, then removed, then stored. Checks that a batch
 * names a hash at most once. */
static void apply(bool *view, const struct ty_kv_events_batch *b)
{
    static _Thread_local bool seen[UNIVERSE];
    memset(seen, 0, sizeof(seen));
    if (b->reset)
        memset(view, 0, UNIVERSE * sizeof(bool));
    for (size_t i = 0; i < b->n_removed; i++) {
        assert_true(b->removed[i] < UNIVERSE && !seen[b->removed[i]]);
        seen[b->removed[i]] = true;
        view[b->removed[i]] = false;
    }
    for (size_t i = 0; i < b->n_stored; i++) {
        assert_true(b->stored[i] < UNIVERSE && !seen[b->stored[i]]);
        seen[b->stored[i]] = true;
        view[b->stored[i]] = true;
    }
}

/* Take a batch and expect exactly these lists (any order). */
static void expect(ty_kv_events_t *ev, bool reset, const uint64_t *st, size_t n_st,
                   const uint64_t *rm, size_t n_rm)
{
    struct ty_kv_events_batch b;
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    assert_int_equal(b.reset, reset);
    assert_int_equal(b.n_stored, n_st);
    assert_int_equal(b.n_removed, n_rm);
    for (size_t i = 0; i < n_st; i++) {
        size_t j = 0;
        while (j < b.n_stored && b.stored[j] != st[i])
            j++;
        assert_true(j < b.n_stored);
    }
    for (size_t i = 0; i < n_rm; i++) {
        size_t j = 0;
        while (j < b.n_removed && b.removed[j] != rm[i])
            j++;
        assert_true(j < b.n_removed);
    }
    assert_int_equal(ty_kv_events_batch_empty(&b), !reset && !n_st && !n_rm);
    ty_kv_events_batch_clear(&b);
}

static ty_kv_events_t *mk(size_t max_pending)
{
    ty_kv_events_t *ev;
    assert_int_equal(ty_kv_events_new(&ev, max_pending), 0);
    expect(ev, true, NULL, 0, NULL, 0); /* the first batch is an (empty) reset */
    return ev;
}

/* A hash in at most one list, with its state at take time; a removal undone within the
 * interval is not sent, a store undone within it is sent as removed (the Conductor may have
 * credited the node with the block on its own). */
static void test_coalescing(void **state)
{
    ty_kv_events_t *ev = mk(0);
    expect(ev, false, NULL, 0, NULL, 0);
    ty_kv_events_note(ev, 1, true);
    ty_kv_events_note(ev, 2, true);
    ty_kv_events_note(ev, 2, true);  /* already held: nothing */
    ty_kv_events_note(ev, 9, false); /* never held: nothing */
    expect(ev, false, (uint64_t[]){1, 2}, 2, NULL, 0);
    ty_kv_events_note(ev, 3, true); /* stored and evicted before any heartbeat saw it */
    ty_kv_events_note(ev, 3, false);
    ty_kv_events_note(ev, 1, false); /* reported, evicted, stored again: as reported */
    ty_kv_events_note(ev, 1, true);
    expect(ev, false, NULL, 0, (uint64_t[]){3}, 1);
    ty_kv_events_note(ev, 2, false);
    ty_kv_events_note(ev, 4, true);
    ty_kv_events_note(ev, 4, false);
    ty_kv_events_note(ev, 4, true);
    expect(ev, false, (uint64_t[]){4}, 1, (uint64_t[]){2}, 1);
    ty_kv_events_free(ev);
}

/* A failed heartbeat's batch comes back under what changed since; its hashes are sent again
 * with their state then, even when they changed twice meanwhile (the Conductor may or may not
 * have applied the lost batch). */
static void test_give_back(void **state)
{
    ty_kv_events_t *ev = mk(0);
    struct ty_kv_events_batch b;
    ty_kv_events_note(ev, 5, true);
    ty_kv_events_note(ev, 6, true);
    ty_kv_events_note(ev, 7, true);
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    assert_int_equal(b.n_stored, 3);
    ty_kv_events_note(ev, 5, false); /* newer: removed */
    ty_kv_events_note(ev, 7, false); /* twice: stored again */
    ty_kv_events_note(ev, 7, true);
    ty_kv_events_note(ev, 8, true); /* new since the take */
    ty_kv_events_give_back(ev, &b);
    assert_null(b.stored);
    expect(ev, false, (uint64_t[]){6, 7, 8}, 3, (uint64_t[]){5}, 1);
    /* given back twice in a row, then a change that would cancel a FLIPPED hash: the hash
     * is still sent (the Conductor's state is unknown after a lost batch) */
    ty_kv_events_note(ev, 6, false);
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    ty_kv_events_give_back(ev, &b);
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    ty_kv_events_give_back(ev, &b);
    ty_kv_events_note(ev, 6, true);
    expect(ev, false, (uint64_t[]){6}, 1, NULL, 0);
    expect(ev, false, NULL, 0, NULL, 0);
    /* an empty batch given back changes nothing */
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    ty_kv_events_give_back(ev, &b);
    expect(ev, false, NULL, 0, NULL, 0);
    ty_kv_events_free(ev);
}

/* More pending than max_pending: the next batch is a reset whose stored list is the mirror;
 * a reset given back is a reset again, and resync asks for one. */
static void test_overflow_and_resync(void **state)
{
    ty_kv_events_t *ev = mk(8);
    bool truth[UNIVERSE] = {0}, view[UNIVERSE] = {0};
    for (uint64_t h = 0; h < 30; h++) {
        ty_kv_events_note(ev, h, true);
        truth[h] = true;
    }
    for (uint64_t h = 0; h < 30; h += 3) {
        ty_kv_events_note(ev, h, false);
        truth[h] = false;
    }
    struct ty_kv_events_batch b;
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    assert_true(b.reset);
    assert_int_equal(b.n_stored, 20);
    assert_int_equal(b.n_removed, 0);
    memset(view, 1, sizeof(view)); /* stale state the reset must wipe */
    apply(view, &b);
    assert_memory_equal(view, truth, sizeof(view));
    ty_kv_events_note(ev, 100, true);
    truth[100] = true;
    ty_kv_events_give_back(ev, &b); /* the reset was lost */
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    assert_true(b.reset);
    assert_int_equal(b.n_stored, 21);
    apply(view, &b);
    assert_memory_equal(view, truth, sizeof(view));
    ty_kv_events_batch_clear(&b);
    /* give-back overflow: a 6-hash batch back under 5 new pending ones */
    for (uint64_t h = 200; h < 206; h++)
        ty_kv_events_note(ev, h, true);
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    for (uint64_t h = 300; h < 305; h++)
        ty_kv_events_note(ev, h, true);
    ty_kv_events_give_back(ev, &b);
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    assert_true(b.reset);
    assert_int_equal(b.n_stored, 21 + 6 + 5);
    ty_kv_events_batch_clear(&b);
    expect(ev, false, NULL, 0, NULL, 0);
    ty_kv_events_resync(ev);
    assert_int_equal(ty_kv_events_take(ev, &b), 0);
    assert_true(b.reset);
    assert_int_equal(b.n_stored, 32);
    ty_kv_events_batch_clear(&b);
    ty_kv_events_free(ev);
}

#define ROUND_NOTES 1500
/* Rounds of the two-thread stress: 200, or 40 on a sanitizer build (TYCHO_SANITIZER_SLOW=1),
 * where the ping-pong between the threads runs 10-50x slower; the same checks */
static int ROUNDS = 200;

struct stress {
    ty_kv_events_t *ev;
    bool truth[UNIVERSE]; /* the producer's, read by the consumer between rounds */
    atomic_bool round_done;
    atomic_size_t takes; /* the consumer's, so that the producer's bursts stay short */
    pthread_barrier_t idle, resume;
};

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Rounds of random notes, pausing after each one for the consumer to check. Within a round,
 * bursts of 1-16 notes with a take between them (left alone, a thread that only notes outruns
 * the consumer and every batch is an overflow reset, which would hide lost changes). */
static void *producer(void *arg)
{
    struct stress *st = arg;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < ROUND_NOTES; i++) {
            uint64_t h = rnd(&r) % UNIVERSE;
            bool stored = rnd(&r) % 8 ? !st->truth[h] : st->truth[h]; /* some no-op notes */
            ty_kv_events_note(st->ev, h, stored);
            st->truth[h] = stored;
            if (rnd(&r) % 8 == 0)
                for (size_t seen = atomic_load(&st->takes); atomic_load(&st->takes) == seen;)
                    sched_yield();
        }
        atomic_store(&st->round_done, true);
        pthread_barrier_wait(&st->idle);
        pthread_barrier_wait(&st->resume);
    }
    return NULL;
}

/* Batches the consumer keeps, applied in order, give the producer's set once the last changes
 * are taken, at the end of every round; lost batches (given back), resyncs (the Conductor
 * forgot the node) and overflows (max_pending 100 of 1000 hashes) included. */
static void test_two_threads(void **state)
{
    if (getenv("TYCHO_SANITIZER_SLOW"))
        ROUNDS = 40;
    static struct stress st;
    static bool view[UNIVERSE];
    memset(&st, 0, sizeof(st));
    memset(view, 0, sizeof(view));
    assert_int_equal(ty_kv_events_new(&st.ev, 100), 0);
    pthread_barrier_init(&st.idle, NULL, 2);
    pthread_barrier_init(&st.resume, NULL, 2);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer, &st), 0);
    uint64_t r = 12345;
    size_t takes = 0, resets = 0, lost = 0;
    struct ty_kv_events_batch b;
    for (int round = 0; round < ROUNDS; round++) {
        while (!atomic_load(&st.round_done)) {
            assert_int_equal(ty_kv_events_take(st.ev, &b), 0);
            atomic_fetch_add(&st.takes, 1);
            if (ty_kv_events_batch_empty(&b)) {
                ty_kv_events_batch_clear(&b);
                sched_yield();
                continue;
            }
            takes++;
            resets += b.reset;
            uint64_t x = rnd(&r) % 256;
            if (x < 80) {
                ty_kv_events_give_back(st.ev, &b);
                lost++;
            } else {
                apply(view, &b);
                ty_kv_events_batch_clear(&b);
            }
            if (x == 255) {
                memset(view, 1, sizeof(view)); /* whatever it held is forgotten */
                ty_kv_events_resync(st.ev);
            }
        }
        pthread_barrier_wait(&st.idle); /* the producer waits: its set is final */
        assert_int_equal(ty_kv_events_take(st.ev, &b), 0);
        apply(view, &b);
        ty_kv_events_batch_clear(&b);
        for (size_t h = 0; h < UNIVERSE; h++)
            assert_int_equal(view[h], st.truth[h]);
        expect(st.ev, false, NULL, 0, NULL, 0);
        atomic_store(&st.round_done, false);
        pthread_barrier_wait(&st.resume);
    }
    pthread_join(t, NULL);
    print_message("%zu takes, %zu resets, %zu given back\n", takes, resets, lost);
    assert_true(takes > 10 * (size_t)ROUNDS && lost > (size_t)ROUNDS && resets < takes / 20);
    pthread_barrier_destroy(&st.idle);
    pthread_barrier_destroy(&st.resume);
    ty_kv_events_free(st.ev);
}

/* The ring keeps the most recent samples, oldest first, and empties on take. */
static void test_timing_ring(void **state)
{
    ty_timing_ring_t *r;
    struct ty_timing_sample out[8];
    assert_int_equal(ty_timing_ring_new(&r, 4), 0);
    assert_int_equal(ty_timing_ring_take(r, out, 8), 0);
    for (uint32_t i = 0; i < 6; i++)
        ty_timing_ring_push(r, &(struct ty_timing_sample){.n_tokens = i, .duration_us = 10 * i});
    assert_int_equal(ty_timing_ring_take(r, out, 8), 4);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(out[i].n_tokens, i + 2);
    assert_int_equal(ty_timing_ring_take(r, out, 8), 0);
    for (uint32_t i = 0; i < 3; i++)
        ty_timing_ring_push(r, &(struct ty_timing_sample){.n_tokens = i});
    assert_int_equal(ty_timing_ring_take(r, out, 2), 2); /* the caller's cap: the latest */
    assert_int_equal(out[0].n_tokens, 1);
    assert_int_equal(out[1].n_tokens, 2);
    ty_timing_ring_push(NULL, &out[0]);
    ty_timing_ring_free(r);
}

/* A follower (the set of a second Conductor): it starts from the set's mirror as a reset, then
 * sees every later note as its own changes, taken independently of the set's batches; after
 * unfollow it sees no more. */
static void test_follower(void **state)
{
    (void)state;
    ty_kv_events_t *ev = mk(0), *f;
    ty_kv_events_note(ev, 1, true);
    ty_kv_events_note(ev, 2, true);
    assert_int_equal(ty_kv_events_new(&f, 0), 0);
    assert_int_equal(ty_kv_events_follow(ev, f), 0);
    assert_int_equal(ty_kv_events_follow(ev, ev), TY_EINVAL);
    uint64_t both[] = {1, 2};
    expect(f, true, both, 2, NULL, 0); /* what the set held when it started following */
    ty_kv_events_note(ev, 3, true);
    ty_kv_events_note(ev, 1, false);
    uint64_t s3[] = {3}, r1[] = {1};
    expect(f, false, s3, 1, r1, 1);
    expect(ev, false, (uint64_t[]){2, 3}, 2, r1, 1); /* the set's own: 1 stored and removed
                                                       * unseen is sent as removed */
    ty_kv_events_unfollow(ev, f);
    ty_kv_events_note(ev, 4, true);
    expect(f, false, NULL, 0, NULL, 0);
    ty_kv_events_free(f);
    ty_kv_events_free(ev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coalescing),
        cmocka_unit_test(test_give_back),
        cmocka_unit_test(test_overflow_and_resync),
        cmocka_unit_test(test_two_threads),
        cmocka_unit_test(test_timing_ring),
        cmocka_unit_test(test_follower),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
