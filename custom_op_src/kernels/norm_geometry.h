// Shape rules of the RMSNorm contract: which dims are normalized, and how `scale` broadcasts over them.
// Plain C++ shared by the CPU and CUDA glue; errors are returned as messages for the caller to prefix with the node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ort_rmsnorm {

using Shape = std::vector<int64_t>;

std::string ShapeToString(const Shape& shape);

// X viewed as [rows, cols]: the dims [axis, rank) are normalized together.
struct NormGeometry {
  size_t axis = 0;  // non-negative
  int64_t rows = 0;
  int64_t cols = 0;
  Shape normalized_shape;  // X.shape[axis:]
};

// Fills `geometry` or returns an error message ("axis -3 is out of range for X of shape [4, 8]").
std::string ResolveGeometry(const Shape& x_shape, int64_t axis, NormGeometry* geometry);

// How a valid scale is laid over one row of `cols` elements.
enum class ScaleLayout {
  kPerElement,  // scale holds exactly `cols` values in row order (shape == normalized shape, up to leading 1s)
  kBroadcast,   // anything else broadcastable (e.g. [1], [d1, 1]): expand with ExpandScale
};

// Checks that `scale_shape` broadcasts onto the normalized dims without changing X's shape: right-aligned, every
// scale dim equals the normalized dim or is 1, and any extra leading dims are 1 (and rank(scale) <= rank(X)).
// Returns "" and sets `*layout`, or an error message naming both shapes.
std::string CheckScaleShape(const Shape& scale_shape, const Shape& x_shape, const NormGeometry& geometry,
                            ScaleLayout* layout);

// Writes the broadcast of `scale` (already float32, `scale_shape` valid per CheckScaleShape) into `out[cols]`.
void ExpandScale(const float* scale, const Shape& scale_shape, const NormGeometry& geometry, float* out);

}  // namespace ort_rmsnorm
