/* A prefill node's KV block events for its heartbeats (DESIGN.md §6): the set of block hashes
 * its KV page cache holds now (the mirror, fed by the pool's ty_kvpool_block_cb), and which of
 * them the Conductor may not know yet (pending), handed out as coalesced batches
 * (Heartbeat.kv_events: reset, then removed, then stored).
 *
 * A hash is pending when its state may differ from what the Conductor holds, counting every
 * batch taken and not given back as applied. A batch says the hash's state at take time. A
 * hash removed and stored again within one interval is not sent; one stored and removed
 * within an interval is sent as removed (the Conductor credits a prefill node with a prompt's
 * blocks when it sends it the prompt, before any event); a batch given back (its heartbeat failed, perhaps after the Conductor applied it) makes its
 * hashes pending again, to be sent with their state then: a repeat of an applied change, or a
 * "removed" the Conductor never saw the "stored" of, both harmless to a set.
 *
 * Threads: note() from any thread (the engine's worker), take/give_back/resync from another
 * (the node's loop); all under one mutex. Ownership: a batch's arrays belong to the caller
 * until given back or cleared; the set must outlive the pool that feeds it.
 */
#ifndef TYCHO_KV_EVENTS_H
#define TYCHO_KV_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_kv_events ty_kv_events_t;

/* reset: the Conductor must forget every block of this node first; `stored` is then the whole
 * mirror. Otherwise the hashes whose state changed: a hash is in at most one list. */
struct ty_kv_events_batch {
    bool reset;
    uint64_t *stored, *removed; /* malloc'ed */
    size_t n_stored, n_removed;
};

/* max_pending: more pending hashes than this turn the next batch into a reset (0: 65536).
 * Returns 0 or TY_ENOMEM. The first take is a reset. */
int ty_kv_events_new(ty_kv_events_t **out, size_t max_pending);
void ty_kv_events_free(ty_kv_events_t *ev);

/* The pool stored (true) or removed `hash`. A store of a held hash or a removal of an absent
 * one changes nothing. Aborts on OOM (metadata). Any thread. */
void ty_kv_events_note(ty_kv_events_t *ev, uint64_t hash, bool stored);

/* Move what is pending into *out (overwritten; clear it after use or give it back): a reset
 * snapshot when one is due, else the changed hashes. Returns 0 or TY_ENOMEM (nothing moved). */
int ty_kv_events_take(ty_kv_events_t *ev, struct ty_kv_events_batch *out);
/* True when the batch tells the Conductor nothing (no reset, no hash): need not be sent. */
bool ty_kv_events_batch_empty(const struct ty_kv_events_batch *b);
/* The batch was not (or perhaps not) applied: its hashes become pending again under their
 * current state (later changes win); a reset batch makes the next take a reset again. Takes
 * the batch's arrays (*b is cleared). */
void ty_kv_events_give_back(ty_kv_events_t *ev, struct ty_kv_events_batch *b);
/* follower gets every note() of ev from now on, its mirror made ev's now and its next take a
 * reset: one set per Conductor of a node that registers with several (each takes its own
 * batches). At most 8 per set; a follower has none of its own. 0, TY_EINVAL or TY_ENOSPC.
 * Unfollow before freeing the follower. */
int ty_kv_events_follow(ty_kv_events_t *ev, ty_kv_events_t *follower);
void ty_kv_events_unfollow(ty_kv_events_t *ev, ty_kv_events_t *follower);
/* The Conductor forgot this node (registration, known=false): the next take is a reset. */
void ty_kv_events_resync(ty_kv_events_t *ev);
/* Free the arrays of a batch the Conductor applied. NULL-safe; *b is cleared. */
void ty_kv_events_batch_clear(struct ty_kv_events_batch *b);

#endif
