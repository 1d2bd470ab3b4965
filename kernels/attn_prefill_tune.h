/* Benchmark-only hook of the tensor-core prefill attention (attn_prefill_tc.cu): selects the
 * kernel shape that ty_cuda_attn_prefill launches for 16-bit pools from then on, so that
 * bench_gpu_attn can time the shapes against each other in one run. 0 (the default): 128 rows
 * per block (two m16 tiles per warp), 64-key tiles, one barrier per tile; 1: 64 rows, Q
 * fragments in registers, three barriers per tile (the first version); 2: 1 with one barrier;
 * 3: 128 rows, 32-key tiles; 4: 0 with three barriers per tile. Returns 0 or TY_EINVAL. Not thread-safe; not for serving code. */
#ifndef TYCHO_ATTN_PREFILL_TUNE_H
#define TYCHO_ATTN_PREFILL_TUNE_H

#ifdef __cplusplus
extern "C" {
#endif

int ty__attn_prefill_tc_set_variant(int variant);

/* Turns the Hopper kernel (attn_prefill_sm90.cu) on or off (default: on only when the
 * environment has TYCHO_CUDA_SM90_PREFILL=1, as the kernel has not run on hardware yet); off,
 * sm_90 devices take the tensor-core path above, so that tests and benchmarks can compare the
 * two. Returns the previous setting. Not thread-safe; not for serving code. */
int ty__attn_prefill_sm90_set_enabled(int on);

/* 1 when the current device can run the Hopper kernel (compute capability 9.0, this binary
 * holds its sm_90a code, cuTensorMapEncodeTiled found), else 0; ignores the setting above. */
int ty__attn_prefill_sm90_available(void);

#ifdef __cplusplus
}
#endif

#endif
