#include "norm_geometry.h"

#include <algorithm>

namespace ort_rmsnorm {

bool operator==(ShapeView a, ShapeView b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

int64_t ElementCount(ShapeView shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string ShapeToString(ShapeView shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return text + "]";
}

namespace {

// The product of dims [begin, end) of `shape`: 0 when one of them is 0, else -1 when one is not known statically
// (negative), else their product, or -1 with *overflow set when that exceeds int64.
int64_t DimProduct(ShapeView shape, size_t begin, size_t end, bool* overflow) {
  int64_t product = 1;
  bool unknown = false;
  for (size_t i = begin; i < end; ++i) {
    if (shape[i] == 0) return 0;
    if (shape[i] < 0) unknown = true;
  }
  if (unknown) return -1;
  for (size_t i = begin; i < end; ++i) {
    if (__builtin_mul_overflow(product, shape[i], &product)) {
      *overflow = true;
      return -1;
    }
  }
  return product;
}

}  // namespace

std::string ResolveGeometry(ShapeView x_shape, int64_t axis, NormGeometry* geometry) {
  const int64_t rank = static_cast<int64_t>(x_shape.size());
  if (rank == 0) return "X is a scalar; it needs at least one dim to normalize";
  if (axis < -rank || axis >= rank) {
    return "axis " + std::to_string(axis) + " is out of range for X of shape " + ShapeToString(x_shape) +
           " (valid: " + std::to_string(-rank) + " to " + std::to_string(rank - 1) + ")";
  }
  geometry->axis = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  bool overflow = false;
  geometry->rows = DimProduct(x_shape, 0, geometry->axis, &overflow);
  geometry->cols = DimProduct(x_shape, geometry->axis, x_shape.size(), &overflow);
  if (geometry->rows == 0 || geometry->cols == 0) {
    // Empty: onnxruntime makes empty tensors whose other dims multiply past int64; nothing is read or written.
    geometry->rows = geometry->cols = 0;
    return "";
  }
  // Only a shape with every dim known has a count to check (a dynamic dim may still be 0 at run time).
  const bool known = std::none_of(x_shape.begin(), x_shape.end(), [](int64_t d) { return d < 0; });
  int64_t elements = 0;
  if (known && (overflow || __builtin_mul_overflow(geometry->rows, geometry->cols, &elements))) {
    return "X of shape " + ShapeToString(x_shape) + " has more elements than a 64-bit count holds";
  }
  return "";
}

std::string CheckScaleShape(ShapeView scale_shape, ShapeView x_shape, const NormGeometry& geometry,
                            ScaleLayout* layout, const char* name) {
  const ShapeView normalized = geometry.Normalized(x_shape);
  bool valid = scale_shape.size() <= x_shape.size();
  bool per_element = true;
  for (size_t k = 1; valid && k <= scale_shape.size(); ++k) {  // k-th dim from the right
    const int64_t dim = scale_shape[scale_shape.size() - k];
    if (k > normalized.size()) {
      valid = dim == 1;
    } else {
      const int64_t target = normalized[normalized.size() - k];
      valid = dim == target || dim == 1;
      per_element = per_element && dim == target;
    }
  }
  // Per element also needs every normalized dim covered (a missing leading dim means repetition) unless it is 1.
  for (size_t k = scale_shape.size() + 1; valid && k <= normalized.size(); ++k) {
    per_element = per_element && normalized[normalized.size() - k] == 1;
  }
  if (!valid) {
    return std::string(name) + " of shape " + ShapeToString(scale_shape) +
           " does not broadcast onto the normalized dims " + ShapeToString(normalized) + " of X " +
           ShapeToString(x_shape) + " (each " + name +
           " dim must equal the normalized dim or be 1, extra leading dims must be 1)";
  }
  *layout = per_element ? ScaleLayout::kPerElement : ScaleLayout::kBroadcast;
  return "";
}

bool MakeScaleBroadcast(ShapeView scale_shape, ShapeView normalized_shape, ScaleBroadcast* broadcast) {
  *broadcast = ScaleBroadcast{};
  const size_t scale_rank = scale_shape.size(), normalized_rank = normalized_shape.size();
  int64_t scale_stride = 1;
  for (size_t k = 1; k <= normalized_rank; ++k) {  // k-th dim from the right, innermost first
    const int64_t dim = normalized_shape[normalized_rank - k];
    const int64_t scale_dim = k <= scale_rank ? scale_shape[scale_rank - k] : 1;
    const int64_t stride = scale_dim == 1 ? 0 : scale_stride;
    scale_stride *= scale_dim;
    if (dim == 1) continue;
    const int last = broadcast->rank - 1;
    if (last >= 0 && (stride == 0) == (broadcast->strides[last] == 0) &&
        (stride == 0 || stride == broadcast->strides[last] * broadcast->dims[last])) {
      broadcast->dims[last] *= dim;
      continue;
    }
    if (broadcast->rank == kMaxScaleDims) return false;
    broadcast->dims[broadcast->rank] = dim;
    broadcast->strides[broadcast->rank] = stride;
    ++broadcast->rank;
  }
  return true;
}

void ExpandScale(const float* scale, const ScaleBroadcast& broadcast, int64_t cols, float* out) {
  for (int64_t i = 0; i < cols; ++i) out[i] = scale[BroadcastSource(broadcast, i)];
}

}  // namespace ort_rmsnorm
