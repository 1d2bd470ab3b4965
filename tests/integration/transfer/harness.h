/* Test harness for the transfer engine: a target peer in another process (this binary re-executed
 * with --child), spoken to over its stdin/stdout with one-line commands, and an independent
 * byte pattern so reads are checked against values the engine never produced. */
#ifndef TY_TEST_XFER_HARNESS_H
#define TY_TEST_XFER_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct peer_proc {
    pid_t pid;
    int cmd_fd;  /* child's stdin */
    FILE *reply; /* child's stdout */
    uint16_t port;
    uint64_t addr_a; /* region filled with pattern_byte(PATTERN_SEED, offset) */
    uint64_t addr_b; /* zeroed region that tests write into */
    uint64_t size;   /* bytes in each region */
};

#define PATTERN_SEED 0x7963686f78666572ull

/* Byte `off` of the pattern (splitmix64 of the 8-byte word index). */
uint8_t pattern_byte(uint64_t seed, uint64_t off);
void pattern_fill(uint8_t *dst, uint64_t seed, uint64_t off, uint64_t len);

/* Start a peer: regions of size_mb MiB each, listening on host. netns: NULL or a namespace name
 * to enter first; etcd/name: etcd mode (lease TTL 2 s). shared: memfd regions (else malloc'd).
 * Returns 0. */
int peer_start(struct peer_proc *p, const char *self_exe, const char *host, uint64_t size_mb,
               const char *netns, const char *etcd, const char *name, bool shared);
/* XXH3 of the peer's memory [addr, addr+len) as the peer sees it now. */
uint64_t peer_hash(struct peer_proc *p, uint64_t addr, uint64_t len);
/* Ask the peer to wait for one notification (up to 10 s) and check that the hash it carries
 * matches its memory at the moment it arrived. Returns 1 match, 0 mismatch, -1 none. */
int peer_check_notify(struct peer_proc *p, char *from, size_t from_cap);
/* Ask the peer to register one more region of len bytes (pattern seed PATTERN_SEED + 2, shared
 * like the others); returns its address or 0. */
uint64_t peer_late_region(struct peer_proc *p, uint64_t len);
void peer_stop(struct peer_proc *p);
void peer_kill(struct peer_proc *p, int sig);

/* The --child entry point. */
int peer_child_main(int argc, char **argv);

/* xorshift64* for test randomness */
uint64_t rng_next(uint64_t *s);

#endif
