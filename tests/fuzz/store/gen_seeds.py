# Seeds for fuzz_store_ssd (see fuzz_store_ssd.c for the input layout and the formats). The
# XXH3 fields are left zero: the harness's fix-up flags (bits 1-3) fill them in.
# Usage: python3 gen_seeds.py tests/fuzz/store/corpus
import os, struct, sys
out = sys.argv[1]
PAGE = 4096

def record(key, data):
    return struct.pack("<IHHQQQ", 0x564B5954, 1, len(key), len(data), 0, 0) + key + data

def pages_of(blob):
    """Split a record image into 4 KiB pages, each as [u16 len, bytes]."""
    out = b""
    for i in range(0, len(blob), PAGE):
        p = blob[i:i + PAGE]
        out += struct.pack("<H", len(p)) + p
    return out

def index(entries):
    body = b"".join(struct.pack("<H", len(k)) + k + struct.pack("<QQQ", off, ln, 0)
                    for k, off, ln in entries)
    return struct.pack("<IIQ", 0x58495954, len(entries), 0) + body

def seed(name, flags, idx, pages):
    open(os.path.join(out, name), "wb").write(bytes([flags]) + struct.pack("<H", len(idx)) + idx + pages)

r1, r2 = record(b"m/abc/0", b"hello kv block"), record(b"m/abc/1", b"x" * 100)
two = pages_of(r1.ljust(PAGE, b"\0")) + pages_of(r2)
seed("scan_two_records", 4 | 8, b"", two)
seed("index_two_records", 1 | 2 | 4 | 8, index([(b"m/abc/0", 0, 14), (b"m/abc/1", PAGE, 100)]), two)
seed("index_bad_sum", 1 | 4 | 8, index([(b"m/abc/0", 0, 14)]), two)
big = record(b"big", bytes(range(256)) * 20)  # 5120 bytes: spans two pages
seed("scan_spanning_record", 4 | 8, b"", pages_of(big))
seed("unaligned_tail", 4 | 8 | (3 << 4), b"", pages_of(r1))
seed("no_fixups", 0, b"", two)
# Regression seeds (bugs fuzz_store_ssd found; see docs/arch/fuzz.md):
# a record / an index entry whose data_len made rec_size() wrap, so a block of 2^64-1 bytes
# was announced; a record key with a NUL byte (registered under a shorter key).
# (2^64-2: 2^64-1 marks a tombstone now)
seed("regress_scan_huge_len", 4 | 8, b"", pages_of(struct.pack("<IHHQQQ", 0x564B5954, 1, 7, 2**64 - 2, 0, 0) + b"m/abc/0"))
seed("regress_index_huge_len", 1 | 2 | 4 | 8, index([(b"m/abc/0", 0, 2**64 - 40)]), two)
# a record of the harness's own key whose data checksum is wrong: the get drops it, the harness
# puts the key again, and after the reopen the dropped copy (listed in bucket 1's index) must
# not shadow the good one (issue #8 follow-up: the first copy found used to win).
seed("regress_dropped_key_reput", 4, b"", pages_of(record(b"fuzz/new-block", b"stale bytes, bad checksum!\0")))
# a tombstone (data_len 2^64-1, no data) after the record it deletes, scanned and indexed
tomb = struct.pack("<IHHQQQ", 0x564B5954, 1, 7, 2**64 - 1, 0, 0) + b"m/abc/0"
deleted = pages_of(r1.ljust(PAGE, b"\0")) + pages_of(tomb)
seed("scan_tombstone", 4 | 8, b"", deleted)
seed("index_tombstone", 1 | 2 | 4 | 8, index([(b"m/abc/0", 0, 14), (b"m/abc/0", PAGE, 2**64 - 1)]), deleted)
