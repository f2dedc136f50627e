#include "norm_geometry.h"

namespace ort_rmsnorm {

std::string ShapeToString(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string ResolveGeometry(const Shape& x_shape, int64_t axis, NormGeometry* geometry) {
  const int64_t rank = static_cast<int64_t>(x_shape.size());
  if (rank == 0) return "X is a scalar; it needs at least one dim to normalize";
  if (axis < -rank || axis >= rank) {
    return "axis " + std::to_string(axis) + " is out of range for X of shape " + ShapeToString(x_shape) +
           " (valid: " + std::to_string(-rank) + " to " + std::to_string(rank - 1) + ")";
  }
  geometry->axis = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  geometry->rows = 1;
  geometry->cols = 1;
  geometry->normalized_shape.assign(x_shape.begin() + static_cast<std::ptrdiff_t>(geometry->axis), x_shape.end());
  for (size_t i = 0; i < x_shape.size(); ++i) (i < geometry->axis ? geometry->rows : geometry->cols) *= x_shape[i];
  return "";
}

std::string CheckScaleShape(const Shape& scale_shape, const Shape& x_shape, const NormGeometry& geometry,
                            ScaleLayout* layout) {
  const Shape& normalized = geometry.normalized_shape;
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
    return "scale of shape " + ShapeToString(scale_shape) + " does not broadcast onto the normalized dims " +
           ShapeToString(normalized) + " of X " + ShapeToString(x_shape) +
           " (each scale dim must equal the normalized dim or be 1, extra leading dims must be 1)";
  }
  *layout = per_element ? ScaleLayout::kPerElement : ScaleLayout::kBroadcast;
  return "";
}

void ExpandScale(const float* scale, const Shape& scale_shape, const NormGeometry& geometry, float* out) {
  const Shape& normalized = geometry.normalized_shape;
  const size_t rank = normalized.size();
  // Stride of each normalized dim in `scale` (0 where scale broadcasts), right-aligned.
  std::vector<int64_t> strides(rank, 0);
  int64_t stride = 1;
  for (size_t k = 1; k <= rank && k <= scale_shape.size(); ++k) {
    const int64_t dim = scale_shape[scale_shape.size() - k];
    if (dim != 1) strides[rank - k] = stride;
    stride *= dim;
  }
  std::vector<int64_t> index(rank, 0);
  int64_t source = 0;
  for (int64_t i = 0; i < geometry.cols; ++i) {
    out[i] = scale[source];
    for (size_t d = rank; d-- > 0;) {  // odometer increment, last dim fastest
      source += strides[d];
      if (++index[d] < normalized[d]) break;
      source -= strides[d] * normalized[d];
      index[d] = 0;
    }
  }
}

}  // namespace ort_rmsnorm
