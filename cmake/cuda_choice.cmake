# ORT_RMSNORM_CUDA=AUTO: the CUDA kernels are built when the onnxruntime that will load the library can run them,
# that is when it has the CUDA execution provider (onnxruntime-gpu), and a CUDA compiler is found. Anything else would
# spend most of the build (2-3 minutes on 2 cores for sm_80 and sm_90, more than the CPU kernels) on kernels nothing
# runs.
#
#   ort_rmsnorm_cuda_choice(<out: ON/OFF> <out: the reason, one line>)
#
# The onnxruntime that will load the library: with scikit-build-core (`pip install .`), the one of the Python
# environment the package is installed into (Python_EXECUTABLE; cmake/onnxruntime_cuda.py); in a standalone build,
# the onnxruntime release ORT_ROOT names, if any.

function(ort_rmsnorm_cuda_choice out_enabled out_reason)
  set(runtime "")
  if(DEFINED SKBUILD AND Python_EXECUTABLE)
    execute_process(COMMAND "${Python_EXECUTABLE}" -I "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/onnxruntime_cuda.py"
      OUTPUT_VARIABLE probe RESULT_VARIABLE status ERROR_VARIABLE probe_error OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(where "the environment of ${Python_EXECUTABLE}")
    if(NOT status EQUAL 0)
      string(STRIP "${probe_error}" probe_error)
      set(${out_reason} "AUTO: could not tell which onnxruntime ${where} has (${probe_error})" PARENT_SCOPE)
      set(${out_enabled} OFF PARENT_SCOPE)
      return()
    endif()
    string(REGEX MATCH "^[a-z]+" runtime "${probe}")
  elseif(ORT_ROOT)
    set(where "ORT_ROOT (${ORT_ROOT})")
    file(GLOB provider "${ORT_ROOT}/lib/*onnxruntime_providers_cuda.*"
                       "${ORT_ROOT}/lib64/*onnxruntime_providers_cuda.*")
    if(provider)
      set(runtime cuda)
    else()
      set(runtime cpu)
    endif()
  else()
    set(${out_reason}
      "AUTO: a standalone build without ORT_ROOT, no onnxruntime to run them; -DORT_RMSNORM_CUDA=ON builds them"
      PARENT_SCOPE)
    set(${out_enabled} OFF PARENT_SCOPE)
    return()
  endif()

  if(runtime STREQUAL "cuda")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(${out_reason} "AUTO: the onnxruntime in ${where} has the CUDA provider (onnxruntime-gpu)" PARENT_SCOPE)
      set(${out_enabled} ON PARENT_SCOPE)
    else()
      set(${out_reason} "AUTO: the onnxruntime in ${where} has the CUDA provider, but no CUDA compiler was found: \
put nvcc on PATH or set CUDACXX" PARENT_SCOPE)
      set(${out_enabled} OFF PARENT_SCOPE)
    endif()
    return()
  endif()
  if(runtime STREQUAL "cpu")
    set(what "the onnxruntime in ${where} has no CUDA provider (it is not onnxruntime-gpu)")
  else()
    set(what "${where} has no onnxruntime yet (the cpu extra installs the CPU one, onnxruntime)")
  endif()
  set(${out_reason} "AUTO: ${what}; -DORT_RMSNORM_CUDA=ON builds them" PARENT_SCOPE)
  set(${out_enabled} OFF PARENT_SCOPE)
endfunction()
