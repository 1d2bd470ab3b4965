// KV page kernels: appending new tokens' K/V into the paged pool (layout in ty_kernels.h) and
// moving whole pages between the pool and a contiguous buffer (the transfer engine's unit).
#include "ty_kernels_impl.cuh"

namespace {

// One block per token; threads stride over n_kv_heads * head_dim elements of K and of V.
template <typename T>
__global__ void kv_write_kernel(T *k_pool, T *v_pool, const float *k_new, const float *v_new,
                                const int32_t *slots, int n_kv_heads, int page_tokens,
                                int head_dim)
{
    const int t = blockIdx.x;
    const int slot = slots[t];
    if (slot < 0)
        return;
    const int page = slot / page_tokens, off = slot % page_tokens;
    const int row = n_kv_heads * head_dim;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int h = i / head_dim, d = i % head_dim;
        size_t dst = (((size_t)page * n_kv_heads + h) * page_tokens + off) * head_dim + d;
        k_pool[dst] = ty::from_f32<T>(k_new[(size_t)t * row + i]);
        v_pool[dst] = ty::from_f32<T>(v_new[(size_t)t * row + i]);
    }
}

template <typename T>
int kv_write_launch(void *k_pool, void *v_pool, const ty_cuda_kv_layout *l, const float *k_new,
                    const float *v_new, const int32_t *slots, int n_tokens, cudaStream_t st)
{
    kv_write_kernel<T><<<n_tokens, 128, 0, st>>>((T *)k_pool, (T *)v_pool, k_new, v_new, slots,
                                                 l->n_kv_heads, l->page_tokens, l->head_dim);
    return TY_CUDA_LAUNCH_CHECK("kv_write");
}

// One block per page; 16-byte words when every page is 16-byte aligned, else bytes.
template <typename W>
__global__ void copy_pages_kernel(char *pool, char *contig, const int32_t *pages,
                                  size_t page_bytes, int to_pool)
{
    const int i = blockIdx.x;
    W *p = (W *)(pool + (size_t)pages[i] * page_bytes);
    W *c = (W *)(contig + (size_t)i * page_bytes);
    const size_t n = page_bytes / sizeof(W);
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
        if (to_pool)
            p[j] = c[j];
        else
            c[j] = p[j];
    }
}

} // namespace

extern "C" size_t ty_cuda_kv_page_bytes(const struct ty_cuda_kv_layout *l)
{
    return (size_t)l->n_kv_heads * l->page_tokens * l->head_dim * ty_cuda_dtype_size(l->type);
}

extern "C" int ty_cuda_kv_write(void *k_pool, void *v_pool, const struct ty_cuda_kv_layout *l,
                                const float *k_new, const float *v_new, const int32_t *slots,
                                int n_tokens, ty_cuda_stream_t stream)
{
    if (!l || n_tokens < 0 || l->n_kv_heads <= 0 || l->page_tokens <= 0 || l->head_dim <= 0)
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    return TY_DTYPE_DISPATCH(l->type, kv_write_launch, k_pool, v_pool, l, k_new, v_new, slots,
                             n_tokens, (cudaStream_t)stream);
}

extern "C" int ty_cuda_kv_copy_pages(void *pool, void *contig, const int32_t *pages, int n,
                                     size_t page_bytes, int to_pool, ty_cuda_stream_t stream)
{
    if (n < 0 || page_bytes == 0)
        return TY_EINVAL;
    if (n == 0)
        return 0;
    cudaStream_t st = (cudaStream_t)stream;
    bool vec = page_bytes % 16 == 0 && (uintptr_t)pool % 16 == 0 && (uintptr_t)contig % 16 == 0;
    if (vec)
        copy_pages_kernel<uint4><<<n, 256, 0, st>>>((char *)pool, (char *)contig, pages,
                                                    page_bytes, to_pool);
    else
        copy_pages_kernel<unsigned char><<<n, 256, 0, st>>>((char *)pool, (char *)contig, pages,
                                                            page_bytes, to_pool);
    return TY_CUDA_LAUNCH_CHECK("kv_copy_pages");
}
