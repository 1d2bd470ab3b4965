"""Loopback ports for the daemons a test starts.

A port taken with bind(("127.0.0.1", 0)) comes from the kernel's ephemeral range, the same range
every daemon's own outgoing connections and port-0 listeners draw from: between the test closing
its probe socket and the daemon binding, one of the cluster's other daemons may take it (the chaos
soak once lost a Conductor that way: "cannot listen for nodes ...: address already in use").
free_port() therefore picks at random below the ephemeral range (where the kernel never hands
out ports on its own), checks the port can be bound now, and never gives the same port twice in
one process. Where the range leaves no room below it, it falls back to the kernel's choice.
"""
import random
import socket

_given = set()
_rng = random.SystemRandom()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port():
    """A loopback TCP port nothing holds now, outside the ephemeral range where there is room."""
    low = 10000
    high = _ephemeral_low()
    if high - low >= 1000:
        for _ in range(500):
            p = _rng.randrange(low, high)
            if p not in _given and _bindable(p):
                _given.add(p)
                return p
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p not in _given:
            _given.add(p)
            return p
