# GPU benchmarks, included from kernels/CMakeLists.txt (only when CUDA is found). Plain
# executables run by scripts/gpu-check.sh; they exit 77 without a GPU.
add_executable(bench_gpu_attn ${CMAKE_SOURCE_DIR}/bench/gpu/bench_attn.c)
target_link_libraries(bench_gpu_attn PRIVATE ty_kernels ty_common CUDA::cudart m)
set_target_properties(bench_gpu_attn PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench/gpu)
