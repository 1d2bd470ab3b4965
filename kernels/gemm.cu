// Projections through cuBLAS. Row-major y = x W^T is column-major y^T = W x^T with W read as
// the transpose of a (n_in, n_out) column-major matrix: cublasGemmEx(T, N, n_out, n_rows, n_in).
#include "ty_kernels_impl.cuh"

#include <cublas_v2.h>

namespace {

bool cublas_type(enum ty_cuda_dtype t, cudaDataType_t *out)
{
    switch (t) {
    case TY_CUDA_F32: *out = CUDA_R_32F; return true;
    case TY_CUDA_F16: *out = CUDA_R_16F; return true;
    case TY_CUDA_BF16: *out = CUDA_R_16BF; return true;
    default: return false;
    }
}

} // namespace

extern "C" int ty_cuda_gemm(ty_cublas_t h, float *y, const void *x, const void *w,
                            enum ty_cuda_dtype w_type, int n_rows, int n_in, int n_out)
{
    if (!h || n_rows < 0 || n_in <= 0 || n_out <= 0)
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    cudaDataType_t ab;
    if (!cublas_type(w_type, &ab))
        return TY_EINVAL;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx((cublasHandle_t)h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_rows,
                                    n_in, &one, w, ab, n_in, x, ab, n_in, &zero, y, CUDA_R_32F,
                                    n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        TY_LOG_ERROR("cuda", "cublasGemmEx(%d x %d x %d) failed: %s (%s:%d)", n_rows, n_out, n_in,
                     cublasGetStatusString(s), __FILE__, __LINE__);
        return TY_ECUDA;
    }
    return 0;
}

// Per head b, column-major: y_b^T (n_out, n_rows) = A x_b^T with x_b^T the row-major x_b as is.
// trans_w 0: A = W_b, the transpose of the row-major (n_out, n_in) W_b read column-major (op T,
// as ty_cuda_gemm); trans_w 1: the row-major (n_in, n_out) W_b read column-major is already
// the (n_out, n_in) A = W_b^T (op N).
extern "C" int ty_cuda_gemm_heads(ty_cublas_t h, float *y, int ldy, long long y_head,
                                  const void *x, int ldx, long long x_head, const void *w,
                                  enum ty_cuda_dtype w_type, int ldw, long long w_head,
                                  int trans_w, int n_rows, int n_in, int n_out, int batch)
{
    cudaDataType_t ab;
    if (!h || !cublas_type(w_type, &ab) || n_rows < 0 || n_in <= 0 || n_out <= 0 || batch < 0 ||
        ldx < n_in || ldy < n_out || ldw < (trans_w ? n_out : n_in) || x_head < 0 ||
        y_head < 0 || w_head < 0)
        return TY_EINVAL;
    if (n_rows == 0 || batch == 0)
        return 0;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        (cublasHandle_t)h, trans_w ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_rows, n_in,
        &one, w, ab, ldw, w_head, x, ab, ldx, x_head, &zero, y, CUDA_R_32F, ldy, y_head, batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        TY_LOG_ERROR("cuda", "cublasGemmStridedBatchedEx(%d x (%d x %d x %d)) failed: %s (%s:%d)",
                     batch, n_rows, n_out, n_in, cublasGetStatusString(s), __FILE__, __LINE__);
        return TY_ECUDA;
    }
    return 0;
}
