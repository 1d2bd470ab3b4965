# GPU benchmarks, included from kernels/CMakeLists.txt (only when CUDA is found). Plain
# executables run by scripts/gpu-check.sh; they exit 77 without a GPU.
add_executable(bench_gpu_attn ${CMAKE_SOURCE_DIR}/bench/gpu/bench_attn.c)
target_link_libraries(bench_gpu_attn PRIVATE ty_kernels ty_common CUDA::cudart m)
set_target_properties(bench_gpu_attn PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench/gpu)

# Decode tokens/s of a whole model on the CUDA backend (bench_decode.c; needs the backend).
if(TARGET ty_backend_cuda AND TARGET ty_engine)
  add_executable(bench_gpu_decode ${CMAKE_SOURCE_DIR}/bench/gpu/bench_decode.c)
  target_link_libraries(bench_gpu_decode PRIVATE ty_engine ty_common m)
  set_target_properties(bench_gpu_decode PROPERTIES
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench/gpu)
endif()
