/* GPU smoke test: RMSNorm kernel and cuBLAS SGEMM against straightforward CPU loops. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ty_kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void test_rmsnorm_matches_cpu(void **state)
{
    enum { ROWS = 7, DIM = 1000 }; /* odd sizes on purpose */
    static float x[ROWS * DIM], w[DIM], got[ROWS * DIM];
    unsigned s = 1;
    for (int i = 0; i < ROWS * DIM; i++)
        x[i] = frand(&s) * 4.0f;
    for (int i = 0; i < DIM; i++)
        w[i] = 1.0f + frand(&s);
    float *dx, *dw, *dout;
    assert_int_equal(cudaMalloc((void **)&dx, sizeof(x)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dw, sizeof(w)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dout, sizeof(x)), cudaSuccess);
    cudaMemcpy(dx, x, sizeof(x), cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w, sizeof(w), cudaMemcpyHostToDevice);
    cudaMemset(dout, 0xff, sizeof(x)); /* poison: NaNs where the kernel writes nothing */
    assert_int_equal(ty_cuda_rmsnorm_f32(dout, dx, dw, ROWS, DIM, 1e-5f, NULL), 0);
    assert_int_equal(cudaMemcpy(got, dout, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int r = 0; r < ROWS; r++) {
        double ss = 0;
        for (int i = 0; i < DIM; i++)
            ss += (double)x[r * DIM + i] * x[r * DIM + i];
        double scale = 1.0 / sqrt(ss / DIM + 1e-5);
        for (int i = 0; i < DIM; i++) {
            double want = x[r * DIM + i] * scale * w[i];
            assert_true(fabs(got[r * DIM + i] - want) <= 1e-4 * (1.0 + fabs(want)));
        }
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dout);
}

static void test_cublas_sgemm_matches_cpu(void **state)
{
    enum { M = 33, N = 17, K = 65 };
    static float a[M * K], b[K * N], c[M * N];
    unsigned s = 7;
    for (int i = 0; i < M * K; i++)
        a[i] = frand(&s);
    for (int i = 0; i < K * N; i++)
        b[i] = frand(&s);
    float *da, *db, *dc;
    cudaMalloc((void **)&da, sizeof(a));
    cudaMalloc((void **)&db, sizeof(b));
    cudaMalloc((void **)&dc, sizeof(c));
    cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice);
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    /* Row-major C = A B computed as column-major C^T = B^T A^T. */
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, db, N, da, K, &zero,
                                 dc, N),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemcpy(c, dc, sizeof(c), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0;
            for (int k = 0; k < K; k++)
                want += (double)a[i * K + k] * b[k * N + j];
            assert_true(fabs(c[i * N + j] - want) <= 1e-4 * (1.0 + fabs(want)));
        }
    cublasDestroy(h);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("test_gpu_smoke: no CUDA device (%s), skipping\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_matches_cpu),
        cmocka_unit_test(test_cublas_sgemm_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
