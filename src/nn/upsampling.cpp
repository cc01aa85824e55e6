// torch.nn.functional.interpolate and torch.nn.Upsample for [N, C, H, W] inputs, composed from
// gathers (nearest) and matrix products (bilinear, bicubic) whose index lists and weights are
// PyTorch's, computed on the host from the sizes. Not a primitive: gradients come from
// index_select's and matmul's rules.
#include <algorithm>
#include <cmath>

#include "lockstep/autocast.h"
#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn {

using util::cat;

namespace {

enum class Mode { Nearest, NearestExact, Bilinear, Bicubic };

Mode mode_of(const std::string& mode, const Loc& loc) {
  if (mode == "nearest") return Mode::Nearest;
  if (mode == "nearest-exact") return Mode::NearestExact;
  if (mode == "bilinear") return Mode::Bilinear;
  if (mode == "bicubic") return Mode::Bicubic;
  util::fail(loc, "interpolate", cat("mode '", mode, "' is not supported for 4-d inputs"),
             "Use 'nearest', 'nearest-exact', 'bilinear' or 'bicubic'");
}

// One axis: from `in` entries to `out`; `scale_factor` is the user's (0: none), which PyTorch's
// kernels use in place of in / out when given.
struct Axis {
  int64_t in = 0, out = 0;
  double scale_factor = 0;
};

// PyTorch's compute_scales_value and area_pixel_compute_scale (UpSample.h), in T as its CPU
// kernels compute them (float for float inputs).
template <typename T>
T pixel_scale(const Axis& a, bool align_corners) {
  if (align_corners) return a.out > 1 ? static_cast<T>(a.in - 1) / static_cast<T>(a.out - 1) : T(0);
  return a.scale_factor > 0 ? static_cast<T>(1.0 / a.scale_factor)
                            : static_cast<T>(a.in) / static_cast<T>(a.out);
}

// area_pixel_compute_source_index.
template <typename T>
T source_index(T scale, int64_t i, bool align_corners, bool cubic) {
  if (align_corners) return scale * static_cast<T>(i);
  const T src = static_cast<T>(static_cast<double>(scale) * (static_cast<double>(i) + 0.5) - 0.5);
  return !cubic && src < 0 ? T(0) : src;
}

// The source index of each output, as PyTorch's CPU kernels compute it: floor(i * scale), or
// floor((i + 0.5) * scale) for nearest-exact. `shortcuts`: PyTorch's channels-last kernel (which
// a contiguous tensor of one channel takes) uses nearest_idx, whose equal and doubled sizes ignore
// the scale factor; its kernel for several channels does not.
template <typename T>
std::vector<int64_t> nearest_indices(const Axis& a, bool exact, bool shortcuts) {
  const T scale = pixel_scale<T>(a, false);
  std::vector<int64_t> idx(static_cast<size_t>(a.out));
  for (int64_t i = 0; i < a.out; ++i) {
    if (!exact && shortcuts && (a.out == a.in || a.out == 2 * a.in)) {
      idx[static_cast<size_t>(i)] = a.out == a.in ? i : i / 2;
      continue;
    }
    const T src = exact
                      ? static_cast<T>(static_cast<double>(scale) * (static_cast<double>(i) + 0.5))
                      : scale * static_cast<T>(i);
    idx[static_cast<size_t>(i)] = std::min(static_cast<int64_t>(std::floor(src)), a.in - 1);
  }
  return idx;
}

// PyTorch's get_cubic_upsample_coefficients, A = -0.75.
template <typename T>
std::array<T, 4> cubic_coefficients(T t) {
  const T A = T(-0.75);
  const auto near = [A](T x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  const auto far = [A](T x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  return {far(t + 1), near(t), near(1 - t), far(2 - t)};
}

// [out, in] (or [in, out] with `transposed`): row i holds the weights of output i.
template <typename T>
std::vector<T> interpolation_matrix(const Axis& a, Mode mode, bool align_corners, bool transposed) {
  std::vector<T> m(static_cast<size_t>(a.out * a.in), T(0));
  const auto at = [&](int64_t i, int64_t j) -> T& {
    return m[static_cast<size_t>(transposed ? j * a.out + i : i * a.in + j)];
  };
  const T scale = pixel_scale<T>(a, align_corners);
  for (int64_t i = 0; i < a.out; ++i) {
    if (mode == Mode::Bilinear) {
      const T src = source_index(scale, i, align_corners, false);
      const auto i0 = static_cast<int64_t>(src);
      const T l1 = std::min(src - static_cast<T>(i0), T(1));
      at(i, i0) += T(1) - l1;
      at(i, i0 + (i0 < a.in - 1 ? 1 : 0)) += l1;
    } else {
      const T src = source_index(scale, i, align_corners, true);
      const auto i0 = static_cast<int64_t>(std::floor(src));
      const std::array<T, 4> w = cubic_coefficients(src - static_cast<T>(i0));
      for (int64_t k = 0; k < 4; ++k) at(i, std::clamp(i0 - 1 + k, int64_t{0}, a.in - 1)) += w[k];
    }
  }
  return m;
}

template <typename T>
bool is_identity(const std::vector<T>& m, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (m[static_cast<size_t>(i * n + j)] != (i == j ? T(1) : T(0))) return false;
  return true;
}

template <typename T>
Tensor resample(const Tensor& x, const std::array<Axis, 2>& axes, Mode mode, bool align_corners,
                const Loc& loc) {
  Tensor y = x;
  for (int d = 0; d < 2; ++d) {
    const Axis& a = axes[static_cast<size_t>(d)];
    if (mode == Mode::Nearest || mode == Mode::NearestExact) {
      std::vector<int64_t> idx = nearest_indices<T>(a, mode == Mode::NearestExact, x.size(1) == 1);
      bool identity = a.in == a.out;
      for (int64_t i = 0; identity && i < a.out; ++i) identity = idx[static_cast<size_t>(i)] == i;
      if (!identity) y = index_select(y, 2 + d, from_vector(idx, {a.out}, x.device(), loc), loc);
      continue;
    }
    // PyTorch's separable bilinear kernel leaves an axis of unchanged size as it is, whatever
    // the scale factor; its bicubic kernel does not.
    if (mode == Mode::Bilinear && a.in == a.out) continue;
    // Along H: [out, in] @ [N, C, in, W]; along W: [N, C, H', in] @ [in, out].
    const bool along_w = d == 1;
    std::vector<T> m = interpolation_matrix<T>(a, mode, align_corners, along_w);
    if (a.in == a.out && is_identity(m, a.in)) continue;
    Tensor w = from_vector(m, along_w ? Shape{a.in, a.out} : Shape{a.out, a.in}, x.device(), loc);
    if (w.dtype() != y.dtype()) w = cast(w, y.dtype(), loc);
    y = along_w ? matmul(y, w, loc) : matmul(w, y, loc);
  }
  return y;
}

}  // namespace

Tensor interpolate(const Tensor& input, const InterpolateOptions& o, Loc loc) {
  const char* op = "interpolate";
  const Mode mode = mode_of(o.mode, loc);
  if (input.dim() != 4)
    util::fail(loc, op, cat("input must be [N, C, H, W], got ", shape_str(input.shape())),
               "Only 4-d inputs are supported");
  if (o.align_corners.has_value() && (mode == Mode::Nearest || mode == Mode::NearestExact))
    util::fail(loc, op,
               "align_corners option can only be set with the interpolating modes: linear | "
               "bilinear | bicubic | trilinear",
               "Leave align_corners unset for nearest");
  if (o.size.empty() == o.scale_factor.empty())
    util::fail(loc, op, "only one of size or scale_factor should be defined",
               "Give size or scale_factor");
  if (o.size.size() > 2 || o.scale_factor.size() > 2)
    util::fail(loc, op,
               cat("size and scale_factor have 1 or 2 values for 2 spatial dims, got ",
                   o.size.size() + o.scale_factor.size()),
               "");
  const bool recompute = o.recompute_scale_factor.value_or(false);
  if (recompute && !o.size.empty())
    util::fail(loc, op, "recompute_scale_factor is not meaningful with an explicit size", "");
  std::array<Axis, 2> axes;
  for (size_t d = 0; d < 2; ++d) {
    Axis& a = axes[d];
    a.in = input.size(static_cast<int64_t>(2 + d));
    if (!o.size.empty()) {
      a.out = o.size[o.size.size() == 1 ? 0 : d];
    } else {
      const double f = o.scale_factor[o.scale_factor.size() == 1 ? 0 : d];
      a.out = static_cast<int64_t>(std::floor(static_cast<double>(a.in) * f));
      if (!recompute) a.scale_factor = f;
    }
    if (a.in <= 0 || a.out <= 0)
      util::fail(
          loc, op,
          cat("input and output sizes should be greater than 0, but got input (H: ", input.size(2),
              ", W: ", input.size(3), ") output (", axes[0].out, ", ", a.out, ")"),
          "");
  }
  const bool align_corners = o.align_corners.value_or(false);
  // PyTorch runs upsampling in f32 under autocast.
  Tensor x = input;
  std::optional<AutocastScope> full_precision;
  if (autocast_dtype().has_value()) {
    full_precision.emplace(DType::F32, loc);
    if (x.dtype() == DType::BF16) x = cast(x, DType::F32, loc);
  }
  if (x.dtype() == DType::F64) return resample<double>(x, axes, mode, align_corners, loc);
  return resample<float>(x, axes, mode, align_corners, loc);
}

Upsample::Upsample(const InterpolateOptions& o) : options(o) {
  if (o.size.empty() == o.scale_factor.empty())
    throw Error("Upsample: give one of size and scale_factor");
}

Tensor Upsample::forward(const Tensor& x) { return interpolate(x, options); }

}  // namespace lockstep::nn
