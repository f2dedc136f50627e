#include "norm_op.h"

#include <algorithm>
#include <cstdio>

namespace ort_rmsnorm {
namespace {

enum class AttributeType { kAbsent, kInt, kFloat, kOther };

const char* TypeName(AttributeType type) {
  switch (type) {
    case AttributeType::kInt: return "an int";
    case AttributeType::kFloat: return "a float";
    case AttributeType::kOther: return "another type (string, tensor or list)";
    case AttributeType::kAbsent: break;
  }
  return "absent";
}

bool Succeeded(OrtStatus* status) {
  if (!status) return true;
  Ort::GetApi().ReleaseStatus(status);
  return false;
}

// The kernel-info API has no "has attribute": probe the types we care about, so that an attribute of the wrong
// type is reported instead of being mistaken for an absent one (and silently replaced by the default).
AttributeType Probe(const OrtKernelInfo* info, const char* name, int64_t* int_value, float* float_value) {
  const OrtApi& api = Ort::GetApi();
  if (Succeeded(api.KernelInfoGetAttribute_int64(info, name, int_value))) return AttributeType::kInt;
  if (Succeeded(api.KernelInfoGetAttribute_float(info, name, float_value))) return AttributeType::kFloat;
  size_t size = 0;
  if (Succeeded(api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) ||
      Succeeded(api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)) ||
      Succeeded(api.KernelInfoGetAttributeArray_float(info, name, nullptr, &size))) {
    return AttributeType::kOther;
  }
  return AttributeType::kAbsent;
}

}  // namespace

NormAttributes::NormAttributes(const Ort::ConstKernelInfo& info, const char* op, bool skip) : op_name(op) {
  node_name = info.GetNodeName();
  outputs = info.GetOutputCount();
  while (!node_name.empty() && node_name.back() == '\0') node_name.pop_back();

  int64_t int_value = 0;
  float float_value = 0.0f;
  switch (AttributeType type = Probe(info, "axis", &int_value, &float_value)) {
    case AttributeType::kAbsent: break;
    case AttributeType::kInt: axis = int_value; break;
    default: Fail(std::string("attribute 'axis' must be an int, got ") + TypeName(type));
  }
  switch (AttributeType type = Probe(info, "epsilon", &int_value, &float_value)) {
    case AttributeType::kAbsent: break;
    case AttributeType::kFloat: epsilon = float_value; break;
    default: Fail(std::string("attribute 'epsilon' must be a float, got ") + TypeName(type));
  }
  if (!std::isfinite(epsilon) || epsilon < 0.0f) {
    char value[32];
    std::snprintf(value, sizeof value, "%.9g", static_cast<double>(epsilon));
    Fail(std::string("attribute 'epsilon' must be finite and >= 0, got ") + value);
  }
  switch (AttributeType type = Probe(info, "eps_outside_sqrt", &int_value, &float_value)) {
    case AttributeType::kAbsent: break;
    case AttributeType::kInt:
      if (int_value != 0 && int_value != 1) {
        Fail("attribute 'eps_outside_sqrt' must be 0 or 1, got " + std::to_string(int_value));
      }
      eps_outside_sqrt = int_value == 1;
      break;
    default: Fail(std::string("attribute 'eps_outside_sqrt' must be an int (0 or 1), got ") + TypeName(type));
  }
  const AttributeType float32_sum = Probe(info, "normalize_float32_sum", &int_value, &float_value);
  if (float32_sum != AttributeType::kAbsent && !skip) {
    Fail("attribute 'normalize_float32_sum' is SkipRMSNorm's; RMSNorm has no sum to normalize");
  }
  switch (float32_sum) {
    case AttributeType::kAbsent: break;
    case AttributeType::kInt:
      if (int_value != 0 && int_value != 1) {
        Fail("attribute 'normalize_float32_sum' must be 0 or 1, got " + std::to_string(int_value));
      }
      normalize_float32_sum = int_value == 1;
      break;
    default:
      Fail(std::string("attribute 'normalize_float32_sum' must be an int (0 or 1), got ") + TypeName(float32_sum));
  }
}

void NormAttributes::Fail(const std::string& problem, OrtErrorCode code) const {
  const std::string node = node_name.empty() ? "(unnamed)" : "'" + node_name + "'";
  throw Ort::Exception(op_name + " node " + node + ": " + problem, code);
}

NormGeometry NormAttributes::Geometry(ShapeView x_shape) const {
  NormGeometry geometry;
  if (std::string error = ResolveGeometry(x_shape, axis, &geometry); !error.empty()) Fail(error);
  return geometry;
}

ScaleLayout NormAttributes::ScaleLayoutFor(ShapeView shape, ShapeView x_shape, const NormGeometry& geometry,
                                           const char* name) const {
  ScaleLayout layout;
  if (std::string error = CheckScaleShape(shape, x_shape, geometry, &layout, name); !error.empty()) Fail(error);
  return layout;
}

ScaleBroadcast NormAttributes::BroadcastFor(ShapeView shape, ShapeView x_shape, const NormGeometry& geometry,
                                            const char* name) const {
  ScaleBroadcast broadcast;
  if (!MakeScaleBroadcast(shape, geometry.Normalized(x_shape), &broadcast)) {
    Fail(std::string(name) + " of shape " + ShapeToString(shape) + " broadcasts over the normalized dims " +
             ShapeToString(geometry.Normalized(x_shape)) + " in a pattern of more than " +
             std::to_string(kMaxScaleDims) + " alternating dims, which is not supported",
         ORT_NOT_IMPLEMENTED);
  }
  return broadcast;
}

void NormAttributes::CheckSkipShape(ShapeView skip_shape, ShapeView x_shape) const {
  if (skip_shape != x_shape) {
    Fail("skip of shape " + ShapeToString(skip_shape) + " must have the shape of X " + ShapeToString(x_shape));
  }
}

std::optional<StaticInput> NormAttributes::CheckStaticInput(const Ort::ConstKernelInfo& info) const {
  const Ort::TypeInfo x_type = info.GetInputTypeInfo(0);
  if (x_type.GetONNXType() != ONNX_TYPE_TENSOR) return std::nullopt;
  Shape x_shape = x_type.GetTensorTypeAndShapeInfo().GetShape();
  if (x_shape.empty()) return std::nullopt;  // unknown rank (or a scalar, which fails at run time with its shape)
  NormGeometry geometry = Geometry(x_shape);
  const ShapeView normalized = geometry.Normalized(x_shape);
  const bool known = std::none_of(normalized.begin(), normalized.end(), [](int64_t d) { return d < 0; });
  return StaticInput{std::move(x_shape), std::move(geometry), known};
}

Shape ShapeOf(const Ort::ConstValue& value) { return value.GetTensorTypeAndShapeInfo().GetShape(); }

TensorDims::TensorDims(const OrtValue* value) {
  if (const ShapeReferenceFn shape_reference = ShapeReference()) {
    ONNXTensorElementDataType element_type;
    const int64_t* dims = nullptr;
    Ort::ThrowOnError(shape_reference(value, &element_type, &dims, &rank_));
    int64_t* copy = inline_;
    if (rank_ > kInlineRank) {
      heap_.resize(rank_);
      copy = heap_.data();
    }
    std::copy(dims, dims + rank_, copy);
    return;
  }
  const OrtApi& api = Ort::GetApi();
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  Ort::ThrowOnError(api.GetTensorTypeAndShape(value, &raw));
  const Ort::TensorTypeAndShapeInfo info(raw);  // released on every path
  Ort::ThrowOnError(api.GetDimensionsCount(raw, &rank_));
  int64_t* dims = inline_;
  if (rank_ > kInlineRank) {
    heap_.resize(rank_);
    dims = heap_.data();
  }
  Ort::ThrowOnError(api.GetDimensions(raw, dims, rank_));
}

}  // namespace ort_rmsnorm
