/* The timing samples a node measured since its previous heartbeat, for the Conductor's
 * cost-model fit (Heartbeat.prefill_timings / decode_timings, DESIGN.md §6): a bounded ring
 * that keeps the most recent `cap` samples in the order they were added (older ones are
 * dropped, so the last sample is always the latest measurement).
 *
 * Threads: push from any thread (the engine's worker), take from another (the node's loop);
 * under one mutex. Ownership: the ring copies the samples; it must outlive its users.
 */
#ifndef TYCHO_TIMING_RING_H
#define TYCHO_TIMING_RING_H

#include <stddef.h>
#include <stdint.h>

typedef struct ty_timing_ring ty_timing_ring_t;

/* One measured forward pass: as the TimingSample message (proto/tycho.proto). */
struct ty_timing_sample {
    uint32_t n_tokens;      /* prefill: prompt tokens computed; decode: sequences stepped */
    uint32_t prefix_tokens; /* prefill: cached tokens reused; decode: the batch's context */
    uint32_t batch_size;    /* requests in the forward pass */
    uint64_t duration_us;
    uint64_t attn_work;     /* prefill: sum over the call's prompts of L^2 - P^2 */
};

/* cap: samples kept between takes (0: 64). Returns 0 or TY_ENOMEM. */
int ty_timing_ring_new(ty_timing_ring_t **out, size_t cap);
void ty_timing_ring_free(ty_timing_ring_t *r);
/* Also hand every pushed sample to cb(arg, sample), outside the ring's lock (e.g. the node's
 * step-time metrics). Set it before any thread pushes; cb runs on the pushing thread. */
void ty_timing_ring_observe(ty_timing_ring_t *r,
                            void (*cb)(void *arg, const struct ty_timing_sample *s), void *arg);
/* Add a sample, dropping the oldest when full. NULL r is a no-op. Any thread. */
void ty_timing_ring_push(ty_timing_ring_t *r, const struct ty_timing_sample *s);
/* Move up to `cap` samples, oldest first, into out (the most recent ones when there are more)
 * and empty the ring. Returns how many. Any thread. */
size_t ty_timing_ring_take(ty_timing_ring_t *r, struct ty_timing_sample *out, size_t cap);

#endif
