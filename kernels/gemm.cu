// Projections through cuBLAS. Row-major y = x W^T is column-major y^T = W x^T with W read as
// the transpose of a (n_in, n_out) column-major matrix: cublasGemmEx(T, N, n_out, n_rows, n_in).
#include "ty_kernels_impl.cuh"

#include <cublas_v2.h>

extern "C" int ty_cuda_gemm(ty_cublas_t h, float *y, const void *x, const void *w,
                            enum ty_cuda_dtype w_type, int n_rows, int n_in, int n_out)
{
    if (!h || n_rows < 0 || n_in <= 0 || n_out <= 0)
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    cudaDataType_t ab;
    switch (w_type) {
    case TY_CUDA_F32:
        ab = CUDA_R_32F;
        break;
    case TY_CUDA_F16:
        ab = CUDA_R_16F;
        break;
    case TY_CUDA_BF16:
        ab = CUDA_R_16BF;
        break;
    default:
        return TY_EINVAL;
    }
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
