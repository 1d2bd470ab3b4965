// Attention sinks (gpt-oss; llama.cpp's soft_max with sinks, the CPU backend's softmax_row):
// a per-head logit that joins the softmax's denominator and weighs no value. Applied after the
// decode and prefill attention kernels, which stay sink-free: with L = log sum_j exp(s_j) over
// the keys a row sees, the sink's softmax is the plain one scaled by
// sum_j exp(s_j) / (sum_j exp(s_j) + exp(sink)). One warp per (row, head) recomputes L (the
// scores q.k * scale over the row's causal, windowed range, read from the pages) and rescales
// the row's output in place. Correctness first: this is a second pass over K.
#include "attn_common.cuh"

#include <math.h>

namespace {

constexpr int kMaxHd = 256;

// Online (max, sum of exp) pairs: merges (m2, l2) into (m, l); m = -inf means empty.
__device__ __forceinline__ void lse_merge(float &m, float &l, float m2, float l2)
{
    if (m2 == -INFINITY)
        return;
    if (m == -INFINITY) {
        m = m2, l = l2;
        return;
    }
    const float M = fmaxf(m, m2);
    l = l * expf(m - M) + l2 * expf(m2 - M);
    m = M;
}

template <typename T>
__global__ void sink_kernel(float *out, const float *q, const T *k_pool, const float *sinks,
                            const int32_t *pos, ty_cuda_attn_rows r, int n_heads, int n_kv,
                            int hd, int B, float scale, int window)
{
    __shared__ __align__(16) float qs[kMaxHd];
    const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const size_t off = ((size_t)row * n_heads + h) * hd;
    for (int i = lane; i < hd; i += 32)
        qs[i] = q[off + i];
    __syncwarp();
    const int32_t *tab = ty::row_table(r, row);
    const int p = pos[row], kvh = h / (n_heads / n_kv);
    const int first = window > 0 && p >= window ? p - window + 1 : 0;
    float m = -INFINITY, l = 0.0f;
    for (int j = first + lane; j <= p; j += 32) {
        const T *k = k_pool + (((size_t)tab[j / B] * n_kv + kvh) * B + j % B) * hd;
        float d = 0.0f;
        for (int i = 0; i < hd; i += 4)
            d += ty::dot4(*(const float4 *)(qs + i), ty::load4(k + i));
        const float s = d * scale;
        lse_merge(m, l, s, 1.0f);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
        lse_merge(m, l, m2, l2);
    }
    // every row sees at least its own key: m is finite
    const float f = l / (l + expf(sinks[h] - m));
    for (int i = lane; i < hd; i += 32)
        out[off + i] *= f;
}

template <typename T>
int sink_launch(float *out, const float *q, const void *k_pool, const float *sinks,
                const int32_t *pos, const ty_cuda_attn_rows &r, int n_rows,
                const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s, cudaStream_t st)
{
    dim3 grid((unsigned)n_rows, (unsigned)s->n_heads);
    sink_kernel<T><<<grid, 32, 0, st>>>(out, q, (const T *)k_pool, sinks, pos, r, s->n_heads,
                                        s->n_kv_heads, s->head_dim, l->page_tokens, s->scale,
                                        s->window);
    return TY_CUDA_LAUNCH_CHECK("attn_sinks");
}

} // namespace

extern "C" int ty_cuda_attn_sinks(float *out, const float *q, const void *k_pool,
                                  const struct ty_cuda_kv_layout *l,
                                  const struct ty_cuda_attn_shape *s, const float *sinks,
                                  const int32_t *pos, int n_rows,
                                  const struct ty_cuda_attn_rows *r, ty_cuda_stream_t stream)
{
    if (!l || !s || !r || !sinks || n_rows < 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 ||
        s->n_heads % s->n_kv_heads || s->head_dim <= 0 || s->head_dim % 4 ||
        s->head_dim > kMaxHd || s->n_heads > 65535 || l->n_kv_heads != s->n_kv_heads ||
        l->head_dim != s->head_dim || l->page_tokens <= 0 || s->window < 0 ||
        r->n_decode < 0 || r->n_chunks < 0 || r->n_decode > n_rows ||
        (r->n_chunks > 0 &&
         (!r->chunk_tables || !r->chunk_q_starts || r->chunk_max_pages <= 0)) ||
        (r->n_decode > 0 && (!r->decode_tables || r->decode_max_pages <= 0)) ||
        (r->n_decode < n_rows && r->n_chunks == 0))
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    return TY_DTYPE_DISPATCH(l->type, sink_launch, out, q, k_pool, sinks, pos, *r, n_rows, l, s,
                             (cudaStream_t)stream);
}
