/* GGUF v3 reader: a file mapped read-only, its metadata and tensor table validated up front.
 *
 * Every offset, length and count read from the file is checked against the file size before it
 * is used, so a truncated or hostile file gives TY_EFORMAT with a message, never a crash.
 * A ty_gguf_t is immutable after ty_gguf_open() and may be read from any thread; pointers into
 * it (strings, tensor data) live until ty_gguf_close().
 */
#ifndef TYCHO_GGUF_H
#define TYCHO_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_gguf ty_gguf_t;

enum ty_gguf_vtype {
    TY_GGUF_UINT8 = 0,
    TY_GGUF_INT8 = 1,
    TY_GGUF_UINT16 = 2,
    TY_GGUF_INT16 = 3,
    TY_GGUF_UINT32 = 4,
    TY_GGUF_INT32 = 5,
    TY_GGUF_FLOAT32 = 6,
    TY_GGUF_BOOL = 7,
    TY_GGUF_STRING = 8,
    TY_GGUF_ARRAY = 9,
    TY_GGUF_UINT64 = 10,
    TY_GGUF_INT64 = 11,
    TY_GGUF_FLOAT64 = 12,
};

/* ggml tensor types Tycho reads (values as in ggml.h; block layouts as ggml-common.h's
 * block_q4_0, block_q8_0, block_q4_K, block_q5_K, block_q6_K, block_mxfp4:
 * include/tycho/quant.h). */
enum ty_ggml_type {
    TY_GGML_F32 = 0,
    TY_GGML_F16 = 1,
    TY_GGML_Q4_0 = 2,
    TY_GGML_Q8_0 = 8,
    TY_GGML_Q4_K = 12,
    TY_GGML_Q5_K = 13,
    TY_GGML_Q6_K = 14,
    TY_GGML_BF16 = 30,
    TY_GGML_MXFP4 = 39,
};

struct ty_gguf_tensor {
    const char *name;
    uint32_t type; /* enum ty_ggml_type (others are rejected at open) */
    uint32_t n_dims;
    uint64_t ne[4]; /* ne[0] is the fastest-varying (row length) */
    const void *data;
    uint64_t nbytes;
};

/* Open and validate `path`. On error returns TY_ENOENT/TY_EFORMAT/TY_ENOMEM and writes a
 * message naming what is wrong into errbuf. */
int ty_gguf_open(ty_gguf_t **out, const char *path, char *errbuf, size_t errlen);
void ty_gguf_close(ty_gguf_t *g);

/* Scalars: true when the key exists with a compatible type (integers widen; u32 accepts any
 * non-negative integer type that fits). */
bool ty_gguf_get_u32(const ty_gguf_t *g, const char *key, uint32_t *out);
bool ty_gguf_get_i64(const ty_gguf_t *g, const char *key, int64_t *out);
bool ty_gguf_get_f32(const ty_gguf_t *g, const char *key, float *out);
bool ty_gguf_get_bool(const ty_gguf_t *g, const char *key, bool *out);
/* String value (not NUL-terminated in the file: use len). */
bool ty_gguf_get_str(const ty_gguf_t *g, const char *key, const char **s, uint64_t *len);

/* Arrays: element type and count; numeric element data is contiguous at *data. */
bool ty_gguf_get_arr(const ty_gguf_t *g, const char *key, enum ty_gguf_vtype *elem, uint64_t *n,
                     const void **data);
/* i-th string of a string array. */
bool ty_gguf_get_arr_str(const ty_gguf_t *g, const char *key, uint64_t i, const char **s,
                         uint64_t *len);

const struct ty_gguf_tensor *ty_gguf_find_tensor(const ty_gguf_t *g, const char *name);
uint64_t ty_gguf_n_tensors(const ty_gguf_t *g);
const struct ty_gguf_tensor *ty_gguf_tensor_at(const ty_gguf_t *g, uint64_t i);

/* Bytes per element row helpers: size in bytes of `n` elements of ggml type `type` (n must be
 * a multiple of the block size for block types), or 0 for an unknown type. */
uint64_t ty_ggml_type_nbytes(uint32_t type, uint64_t n);
const char *ty_ggml_type_name(uint32_t type);
/* Elements per block of `type`: 1 for F32/F16/BF16, 32 for Q4_0/Q8_0, 256 for the K-quants,
 * 0 for a type this reader refuses. A tensor's row length (ne[0]) is a multiple of it. */
uint32_t ty_ggml_type_block(uint32_t type);

/* Metadata entries in file order: key (NUL-terminated copy), value type, and the raw bytes of
 * the whole entry as serialised in the file (key, type and value), for copying into a writer. */
uint64_t ty_gguf_n_kv(const ty_gguf_t *g);
bool ty_gguf_kv_at(const ty_gguf_t *g, uint64_t i, const char **key, enum ty_gguf_vtype *type,
                   const void **raw, uint64_t *raw_len);

/* ---- writer ----------------------------------------------------------------------------------
 * Builds a GGUF v3 file: metadata is serialised as it is added, tensors are declared up front
 * and their data produced at write time by a callback, chunk by chunk, so multi-GiB files
 * never sit in memory. One thread owns a writer. */
typedef struct ty_gguf_writer ty_gguf_writer_t;

/* Fill `len` bytes of tensor `index` starting at byte `offset` of its data. Returns 0 or a
 * negative TY_E* code (which aborts the write). */
typedef int (*ty_gguf_fill_cb)(void *arg, uint64_t index, uint64_t offset, void *buf, size_t len);

int ty_gguf_writer_new(ty_gguf_writer_t **out);
void ty_gguf_writer_free(ty_gguf_writer_t *w);
int ty_gguf_writer_kv_u32(ty_gguf_writer_t *w, const char *key, uint32_t v);
int ty_gguf_writer_kv_f32(ty_gguf_writer_t *w, const char *key, float v);
int ty_gguf_writer_kv_bool(ty_gguf_writer_t *w, const char *key, bool v);
int ty_gguf_writer_kv_str(ty_gguf_writer_t *w, const char *key, const char *v);
/* Append an entry's raw bytes as returned by ty_gguf_kv_at(). */
int ty_gguf_writer_kv_raw(ty_gguf_writer_t *w, const void *raw, uint64_t raw_len);
/* Declare a tensor (data offsets are assigned in declaration order, 32-byte aligned). */
int ty_gguf_writer_tensor(ty_gguf_writer_t *w, const char *name, uint32_t type, uint32_t n_dims,
                          const uint64_t *ne);
/* Write the file at `path` (created or truncated). */
int ty_gguf_writer_write(ty_gguf_writer_t *w, const char *path, ty_gguf_fill_cb fill, void *arg);

#endif
