// Library entry point: onnxruntime calls RegisterCustomOps when a session's options load this library.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "execution_providers.h"
#include "norm_op.h"

namespace ort_rmsnorm {
namespace {

int g_api_version = 0;
int g_runtime_release = 0;
ShapeReferenceFn g_shape_reference = nullptr;

// The API-24 function's slot, where the runtime serves API 24 (kShapeReferenceSlot).
ShapeReferenceFn FindShapeReference(const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(kApiShapeReference);
  if (api == nullptr) return nullptr;
  ShapeReferenceFn function = nullptr;
  std::memcpy(&function, reinterpret_cast<const unsigned char*>(api) + kShapeReferenceSlot * sizeof(void*),
              sizeof function);
  return function;
}

// N for onnxruntime 1.N; a later major version counts as newer than every 1.N.
int ReleaseOf(const char* runtime_version) {
  const long major = std::strtol(runtime_version, nullptr, 10);
  const char* dot = std::strchr(runtime_version, '.');
  const long minor = dot ? std::strtol(dot + 1, nullptr, 10) : 0;
  if (major != 1) return std::numeric_limits<int>::max();
  return static_cast<int>(std::min<long>(minor, std::numeric_limits<int>::max()));
}

}  // namespace

int RuntimeApiVersion() { return g_api_version; }
int RuntimeRelease() { return g_runtime_release; }
ShapeReferenceFn ShapeReference() { return g_shape_reference; }

}  // namespace ort_rmsnorm

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace ort_rmsnorm;
  static std::once_flag once;
  static std::string init_error;
  static OrtCustomOpDomain* domain = nullptr;

  const char* runtime_version = api_base->GetVersionString();
  const int release = ReleaseOf(runtime_version);
  // onnxruntime 1.N serves C API version N; newer runtimes also serve our ORT_API_VERSION, older ones only their own.
  const int api_version = std::min(release, ORT_API_VERSION);
  const OrtApi* api = api_base->GetApi(api_version);
  if (api == nullptr) {  // a runtime older than its own version string claims; every runtime serves version 1
    const OrtApi* v1 = api_base->GetApi(1);
    return v1 ? v1->CreateStatus(ORT_FAIL, "ort_rmsnorm: this onnxruntime does not serve the C API it announces")
              : nullptr;
  }
  if (api_version < kMinRuntimeApiVersion) {
    return api->CreateStatus(ORT_FAIL, (std::string("ort_rmsnorm needs onnxruntime >= 1.") +
                                        std::to_string(kMinRuntimeApiVersion) + ", this is " + runtime_version)
                                           .c_str());
  }

  std::call_once(once, [&] {
    g_api_version = api_version;
    g_runtime_release = release;
    // Asked only of runtimes that announce API 24: older ones print an error for a version they do not serve.
    if (release >= kApiShapeReference) g_shape_reference = FindShapeReference(api_base);
    Ort::InitApi(api);
    const char* requested_isa = std::getenv("ORT_RMSNORM_CPU_ISA");
    const char* isa_error = nullptr;
    const CpuKernels* kernels = SelectCpuKernels(requested_isa, &isa_error);
    if (!kernels) {
      init_error = std::string("ort_rmsnorm: ORT_RMSNORM_CPU_ISA=") + requested_isa + ": " + isa_error;
      return;
    }
    std::vector<const OrtCustomOp*> ops;
    AppendCpuOps(*kernels, ops);
#ifdef ORT_RMSNORM_WITH_CUDA
    AppendCudaOps(ops);
#endif
    if (OrtStatus* status = api->CreateCustomOpDomain(kDomain, &domain)) {
      init_error = api->GetErrorMessage(status);
      api->ReleaseStatus(status);
      return;
    }
    for (const OrtCustomOp* op : ops) {
      if (OrtStatus* status = api->CustomOpDomain_Add(domain, const_cast<OrtCustomOp*>(op))) {
        init_error = api->GetErrorMessage(status);
        api->ReleaseStatus(status);
        return;
      }
    }
  });
  if (!init_error.empty()) return api->CreateStatus(ORT_FAIL, init_error.c_str());
  // The domain is created once and shared by every session's options; it lives until the process ends.
  return api->AddCustomOpDomain(options, domain);
}
