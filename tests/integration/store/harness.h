/* Test harness: start real tycho-store processes on loopback (ports from their port files),
 * stop them with a signal, make per-test temp dirs. Test thread only. */
#ifndef TY_STORE_TEST_HARNESS_H
#define TY_STORE_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

struct proc {
    pid_t pid;
    char port_file[512];
    unsigned master_port, node_port;
};

/* Temp dir of this test run (created on first use, removed by harness_cleanup). */
const char *harness_dir(void);
void harness_cleanup(void);

/* Start tycho-store with the given "--k=v" args (NULL-terminated), optionally inside network
 * namespace `netns` (NULL: none), and wait for its port file. Returns 0 or -1. */
int harness_start(struct proc *p, const char *netns, const char *const *args);

/* Start any command (argv[0] looked up in PATH), output to `log` (NULL: inherited). */
pid_t harness_spawn(const char *const *argv, const char *log);

/* A free TCP port on 127.0.0.1 (bound and released: good enough for tests). */
unsigned harness_free_port(void);

/* Send sig and reap. */
void harness_stop(struct proc *p, int sig);

/* The value of one series of p's /metrics (the metrics= port of its port file), e.g.
 * `tycho_store_reads_total{node="A"}`. Returns 0 and *out, or -1 (no such series, no answer). */
int harness_metric(const struct proc *p, const char *series, double *out);

/* Deterministic value bytes of a key of length n (xorshift seeded by key and version). */
void harness_fill(uint8_t *buf, size_t n, const char *key, uint32_t version);

#endif
