# CUDA kernels (custom_op_src/cuda): included by the top CMakeLists.txt when CUDA is enabled, before the
# onnxruntime glue. Defines
#   ort_rmsnorm_cuda        static library: the kernels and their host launchers (no onnxruntime types), with the
#                           CUDA runtime linked statically, so libort_rmsnorm loads on machines without CUDA and
#                           needs the driver (libcuda) only when a CUDA kernel is first created
#   ort_rmsnorm_gpu_check   (with ORT_RMSNORM_BUILD_TESTS) the standalone numerics check and benchmark
#   ort_rmsnorm_cuda_capi   (with ORT_RMSNORM_BUILD_TESTS) a C entry point over the launchers, for the torch
#                           comparison in tests/cuda/bench_torch.py
# CMAKE_CUDA_ARCHITECTURES defaults to "80;90" (A100 and H100/H200 machine code and PTX); pass e.g.
# -DCMAKE_CUDA_ARCHITECTURES=90 to build for one GPU only.

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build machine code for")
endif()
if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND CMAKE_CXX_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER} CACHE FILEPATH "Host compiler for nvcc")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
message(STATUS "ort_rmsnorm: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")

set(CUDA_KERNEL_DIR ${PROJECT_SOURCE_DIR}/custom_op_src/cuda)
# Warnings of the host compiler too; the device code builds without any.
set(ORT_RMSNORM_CUDA_WARNINGS $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)

add_library(ort_rmsnorm_cuda STATIC
  ${CUDA_KERNEL_DIR}/rmsnorm_cuda.cu
  ${CUDA_KERNEL_DIR}/rmsnorm_kernels_f32.cu
  ${CUDA_KERNEL_DIR}/rmsnorm_kernels_f16.cu
  ${CUDA_KERNEL_DIR}/rmsnorm_kernels_bf16.cu)
target_include_directories(ort_rmsnorm_cuda PUBLIC ${CUDA_KERNEL_DIR})
target_compile_options(ort_rmsnorm_cuda PRIVATE ${ORT_RMSNORM_CUDA_WARNINGS})
set_target_properties(ort_rmsnorm_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY Static)
# ort_rmsnorm_kernels: the shape rules and row statistics shared with the CPU kernels.
target_link_libraries(ort_rmsnorm_cuda PUBLIC CUDA::cudart_static ort_rmsnorm_kernels)

if(ORT_RMSNORM_BUILD_TESTS)
  set(CUDA_TEST_DIR ${PROJECT_SOURCE_DIR}/tests/cuda)
  # The program (options, report), where the kernels run (GPU or emulation), the numerics, the benchmark: apart, so
  # that they compile in parallel.
  add_executable(ort_rmsnorm_gpu_check ${CUDA_TEST_DIR}/gpu_check.cu ${CUDA_TEST_DIR}/gpu_executor.cu
    ${CUDA_TEST_DIR}/gpu_check_numerics.cu ${CUDA_TEST_DIR}/gpu_bench.cu)
  target_include_directories(ort_rmsnorm_gpu_check PRIVATE ${KERNEL_DIR} ${PROJECT_SOURCE_DIR}/tests/cpp)
  # The emulation reads host buffers through the kernels' word types, as the GPU does.
  target_compile_options(ort_rmsnorm_gpu_check PRIVATE ${ORT_RMSNORM_CUDA_WARNINGS}
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fno-strict-aliasing>)
  set_target_properties(ort_rmsnorm_gpu_check PROPERTIES CUDA_RUNTIME_LIBRARY Static)
  target_link_libraries(ort_rmsnorm_gpu_check PRIVATE ort_rmsnorm_cuda)
  # The kernels' row code run on the CPU against the float64 reference: no GPU needed.
  add_test(NAME gpu_check_emulated COMMAND ort_rmsnorm_gpu_check --emulate --quick)

  add_library(ort_rmsnorm_cuda_capi SHARED ${CUDA_TEST_DIR}/launcher_capi.cc)
  target_link_libraries(ort_rmsnorm_cuda_capi PRIVATE ort_rmsnorm_cuda)
endif()
