// The floor of onnxruntime's custom-op call path: ops that do what any custom op of RMSNorm's or SkipRMSNorm's
// signature must do per call, and nothing else. benchmarks/per_call.py times them next to ours and onnxruntime's
// built-in ops; docs/benchmarks.md ("The per-call cost in a graph") has the figures.
//
//   ReadXAllocate(X, ...) -> Y               reads X's dims, allocates Y           (RMSNorm's minimum)
//   ReadXSkipAllocate(X, skip, ...) -> Y, sum  reads X's and skip's dims, allocates Y and sum  (SkipRMSNorm's)
//
// Both declare Y (and sum) with X's type and shape, as our ops do, and may write them in place of X (and skip).
// Written against the C API only (no C++ wrapper), so that nothing but onnxruntime's own work is timed. On
// onnxruntime 1.24 and newer the dims are read as the library reads them, through the API-24 function that returns
// them without a type-and-shape object (custom_op_src/ort/ort_api.h).
#include <onnxruntime_c_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

const OrtApi* g_api = nullptr;
constexpr size_t kMaxRank = 16;
// OrtApi::GetTensorElementTypeAndShapeDataReference, from its slot (see ort_api.h), or nullptr before API 24.
using ShapeReferenceFn = OrtStatus*(ORT_API_CALL*)(const OrtValue*, ONNXTensorElementDataType*, const int64_t**,
                                                    size_t*);
ShapeReferenceFn g_shape_reference = nullptr;

struct FloorOp : OrtCustomOp {
  const char* name;
  size_t tensor_inputs;  // inputs whose dims are read: X, or X and skip
  size_t outputs;
};

const FloorOp& Of(const OrtCustomOp* op) { return *static_cast<const FloorOp*>(op); }

// A failed call would only make the floor lower; the benchmark checks the outputs' shapes.
void Ignore(OrtStatus* status) {
  if (status) g_api->ReleaseStatus(status);
}

OrtStatusPtr ORT_API_CALL Compute(void* kernel, OrtKernelContext* context) {
  const size_t tensor_inputs = *static_cast<size_t*>(kernel);
  int64_t dims[kMaxRank] = {};
  size_t rank = 0;
  for (size_t input = 0; input < tensor_inputs; ++input) {
    const OrtValue* value = nullptr;
    Ignore(g_api->KernelContext_GetInput(context, input, &value));
    if (g_shape_reference) {
      ONNXTensorElementDataType type;
      const int64_t* shape = nullptr;
      Ignore(g_shape_reference(value, &type, &shape, &rank));
      if (rank > kMaxRank) rank = kMaxRank;
      std::memcpy(dims, shape, rank * sizeof(int64_t));
      continue;
    }
    OrtTensorTypeAndShapeInfo* info = nullptr;
    Ignore(g_api->GetTensorTypeAndShape(value, &info));
    Ignore(g_api->GetDimensionsCount(info, &rank));
    if (rank > kMaxRank) rank = kMaxRank;
    Ignore(g_api->GetDimensions(info, dims, rank));
    g_api->ReleaseTensorTypeAndShapeInfo(info);
  }
  size_t outputs = 0;
  Ignore(g_api->KernelContext_GetOutputCount(context, &outputs));
  for (size_t output = 0; output < outputs; ++output) {
    OrtValue* value = nullptr;
    Ignore(g_api->KernelContext_GetOutput(context, output, dims, rank, &value));
  }
  return nullptr;
}

OrtStatusPtr ORT_API_CALL CreateKernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo*, void** kernel) {
  *kernel = new size_t(Of(op).tensor_inputs);
  return nullptr;
}
void ORT_API_CALL DestroyKernel(void* kernel) { delete static_cast<size_t*>(kernel); }

// Every output: X's type and shape.
OrtStatusPtr ORT_API_CALL InferShape(const OrtCustomOp* op, OrtShapeInferContext* context) {
  OrtTensorTypeAndShapeInfo* x = nullptr;  // owned by the context
  if (OrtStatus* status = g_api->ShapeInferContext_GetInputTypeShape(context, 0, &x)) return status;
  for (size_t output = 0; output < Of(op).outputs; ++output) {
    if (OrtStatus* status = g_api->ShapeInferContext_SetOutputTypeShape(context, output, x)) return status;
  }
  return nullptr;
}

size_t ORT_API_CALL MayInplace(int** input_index, int** output_index) {
  *input_index = static_cast<int*>(std::malloc(2 * sizeof(int)));
  *output_index = static_cast<int*>(std::malloc(2 * sizeof(int)));
  if (!*input_index || !*output_index) return 0;
  (*input_index)[0] = 0, (*output_index)[0] = 0;
  (*input_index)[1] = 1, (*output_index)[1] = 1;
  return 2;
}
void ORT_API_CALL ReleaseMayInplace(int* input_index, int* output_index) {
  std::free(input_index);
  std::free(output_index);
}

FloorOp MakeOp(const char* name, size_t tensor_inputs, size_t outputs) {
  FloorOp op;
  std::memset(static_cast<OrtCustomOp*>(&op), 0, sizeof(OrtCustomOp));
  op.name = name;
  op.tensor_inputs = tensor_inputs;
  op.outputs = outputs;
  op.version = 18;  // GetMayInplace
  op.GetName = [](const OrtCustomOp* self) { return Of(self).name; };
  op.GetExecutionProviderType = [](const OrtCustomOp*) { return "CPUExecutionProvider"; };
  op.GetInputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; };  // any
  op.GetInputTypeCount = [](const OrtCustomOp* self) { return Of(self).tensor_inputs + 2; };  // + scale, bias
  op.GetInputCharacteristic = [](const OrtCustomOp* self, size_t index) {
    return index < Of(self).tensor_inputs ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  };
  op.GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; };
  op.GetOutputTypeCount = [](const OrtCustomOp* self) { return Of(self).outputs; };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t index) {
    return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.CreateKernelV2 = CreateKernel;
  op.KernelComputeV2 = Compute;
  op.KernelDestroy = DestroyKernel;
  op.InferOutputShapeFn = InferShape;
  op.GetMayInplace = MayInplace;
  op.ReleaseMayInplace = ReleaseMayInplace;
  return op;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  g_api = api_base->GetApi(18);
  if (!g_api) return nullptr;  // onnxruntime < 1.18: nothing registered, the session then names the missing op
  const char* version = api_base->GetVersionString();  // "1.N...": API 24 from 1.24
  if (std::strncmp(version, "1.", 2) == 0 && std::strtol(version + 2, nullptr, 10) >= 24) {
    if (const OrtApi* api24 = api_base->GetApi(24)) {
      g_shape_reference = reinterpret_cast<const ShapeReferenceFn*>(api24)[414];
    }
  }
  static FloorOp ops[] = {MakeOp("ReadXAllocate", 1, 1), MakeOp("ReadXSkipAllocate", 2, 2)};
  static OrtCustomOpDomain* domain = [] {
    OrtCustomOpDomain* created = nullptr;
    if (OrtStatus* status = g_api->CreateCustomOpDomain("ort_rmsnorm_call_floor", &created)) {
      g_api->ReleaseStatus(status);
      return static_cast<OrtCustomOpDomain*>(nullptr);
    }
    for (FloorOp& op : ops) Ignore(g_api->CustomOpDomain_Add(created, &op));
    return created;
  }();
  if (!domain) return g_api->CreateStatus(ORT_FAIL, "call_floor: could not create the op domain");
  return g_api->AddCustomOpDomain(options, domain);
}
