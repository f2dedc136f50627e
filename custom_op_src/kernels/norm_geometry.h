// Shape rules of the RMSNorm contract: which dims are normalized, and how `scale` broadcasts over them.
// Plain C++ shared by the CPU and CUDA glue; errors are returned as messages for the caller to prefix with the node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "row_statistics.h"  // ORT_RMSNORM_HOST_DEVICE

namespace ort_rmsnorm {

using Shape = std::vector<int64_t>;

// Dims owned elsewhere (a Shape, or a buffer the caller keeps for as long as the view is used): the per-call code
// reads shapes without allocating.
class ShapeView {
 public:
  constexpr ShapeView() = default;
  constexpr ShapeView(const int64_t* dims, size_t rank) : dims_(dims), rank_(rank) {}
  ShapeView(const Shape& shape) : dims_(shape.data()), rank_(shape.size()) {}  // NOLINT: implicit by design

  constexpr size_t size() const { return rank_; }
  constexpr bool empty() const { return rank_ == 0; }
  constexpr const int64_t* data() const { return dims_; }
  constexpr const int64_t* begin() const { return dims_; }
  constexpr const int64_t* end() const { return dims_ + rank_; }
  constexpr int64_t operator[](size_t i) const { return dims_[i]; }
  // The dims from `first` to the last.
  constexpr ShapeView Tail(size_t first) const { return {dims_ + first, rank_ - first}; }
  Shape ToShape() const { return Shape(begin(), end()); }

 private:
  const int64_t* dims_ = nullptr;
  size_t rank_ = 0;
};

bool operator==(ShapeView a, ShapeView b);
inline bool operator!=(ShapeView a, ShapeView b) { return !(a == b); }

// "[2, 8]"; dims not known statically (negative) print as "?".
std::string ShapeToString(ShapeView shape);

// Number of elements of a tensor of `shape` (1 for a scalar).
int64_t ElementCount(ShapeView shape);

// X viewed as [rows, cols]: the dims [axis, rank) are normalized together. An empty X has rows = cols = 0; in a
// declared shape, rows or cols is -1 when a dim it spans is not known statically (or the product overflows).
struct NormGeometry {
  size_t axis = 0;  // non-negative
  int64_t rows = 0;
  int64_t cols = 0;

  // X.shape[axis:], for the X this geometry was resolved from.
  ShapeView Normalized(ShapeView x_shape) const { return x_shape.Tail(axis); }
};

// Fills `geometry` or returns an error message ("axis -3 is out of range for X of shape [4, 8]"; also when every dim
// is known and the element count exceeds int64).
std::string ResolveGeometry(ShapeView x_shape, int64_t axis, NormGeometry* geometry);

// How a valid scale is laid over one row of `cols` elements.
enum class ScaleLayout {
  kPerElement,  // scale holds exactly `cols` values in row order (shape == normalized shape, up to leading 1s)
  kBroadcast,   // anything else broadcastable (e.g. [1], [d1, 1]): expand with ExpandScale
};

// Checks that `scale_shape` broadcasts onto the normalized dims without changing X's shape: right-aligned, every
// scale dim equals the normalized dim or is 1, and any extra leading dims are 1 (and rank(scale) <= rank(X)).
// Returns "" and sets `*layout`, or an error message naming both shapes. SkipRMSNorm's bias follows the same rules
// (`name` says which input the message is about).
std::string CheckScaleShape(ShapeView scale_shape, ShapeView x_shape, const NormGeometry& geometry,
                            ScaleLayout* layout, const char* name = "scale");

// A broadcast of a valid scale over the normalized dims, reduced to at most kMaxScaleDims dims: normalized dims of
// size 1 dropped, neighbours that both broadcast (or both don't) merged. dims/strides innermost first; stride 0 means
// the scale repeats along that dim. A plain struct, so the CUDA kernels take it by value.
constexpr int kMaxScaleDims = 8;
struct ScaleBroadcast {
  int rank = 0;
  int64_t dims[kMaxScaleDims] = {};
  int64_t strides[kMaxScaleDims] = {};
};

// The broadcast of a scale of `scale_shape` over `normalized_shape` (a valid pair per CheckScaleShape). Returns false
// when the pattern needs more than kMaxScaleDims dims (it alternates broadcast and non-broadcast dims that often).
bool MakeScaleBroadcast(ShapeView scale_shape, ShapeView normalized_shape, ScaleBroadcast* broadcast);

namespace {  // internal linkage: see row_statistics.h

// Index into the scale of element i of a row.
ORT_RMSNORM_HOST_DEVICE inline int64_t BroadcastSource(const ScaleBroadcast& broadcast, int64_t i) {
  int64_t source = 0;
  for (int d = 0; d < broadcast.rank; ++d) {
    source += i % broadcast.dims[d] * broadcast.strides[d];
    i /= broadcast.dims[d];
  }
  return source;
}

}  // namespace

// Writes the broadcast of `scale` (already float32) into `out[cols]`.
void ExpandScale(const float* scale, const ScaleBroadcast& broadcast, int64_t cols, float* out);

}  // namespace ort_rmsnorm
