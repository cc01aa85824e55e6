#include "backends/cpu/index_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/by_dtype.h"
#include "backends/cpu/kernels.h"
#include "ir/random_bits.h"
#include "lockstep/dtype.h"
#include "util/check.h"

namespace lockstep::backends::cpu {
namespace {

// Work below this many bytes moved runs on one thread.
constexpr int64_t kParallelBytes = 1 << 18;

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

// Calls f with an unsigned type of `elem` bytes.
template <typename F>
void by_size(size_t elem, F&& f) {
  switch (elem) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      util::internal_fail(__FILE__, __LINE__, "no element of that size");
  }
}

}  // namespace

void gather(size_t elem, const void* x, const Shape& xs, const IndexView& index, const Shape& is,
            int64_t axis, void* out) {
  const int64_t n = shape_numel(is);
  if (n == 0) return;
  const size_t r = is.size();
  const std::vector<int64_t> xst = contiguous_strides(xs);
  // Rows: every dim but the last; the last is walked as a run.
  const int64_t last = is[r - 1];
  const int64_t rows = n / last;
  const bool axis_last = static_cast<size_t>(axis) == r - 1;
  const int64_t ilast = index.strides[r - 1];
  by_size(elem, [&](auto tag) {
    using E = decltype(tag);
    const E* X = static_cast<const E*>(x);
    E* Y = static_cast<E*>(out);
    parallel_for(n * static_cast<int64_t>(elem) > kParallelBytes, rows, [&](int64_t row) {
      int64_t xo = 0, io = 0;
      int64_t pos = row;
      for (size_t d = r - 1; d-- > 0;) {
        const int64_t i = pos % is[d];
        pos /= is[d];
        io += i * index.strides[d];
        if (static_cast<int64_t>(d) != axis) xo += i * xst[d];
      }
      E* y = Y + row * last;
      if (axis_last) {
        for (int64_t j = 0; j < last; ++j) y[j] = X[xo + index.data[io + j * ilast]];
      } else if (ilast == 0) {  // one index for the row: a contiguous run of x
        const E* src = X + xo + index.data[io] * xst[axis];
        std::memcpy(y, src, static_cast<size_t>(last) * sizeof(E));
      } else {
        const int64_t step = xst[axis];
        for (int64_t j = 0; j < last; ++j) y[j] = X[xo + j + index.data[io + j * ilast] * step];
      }
    });
  });
}

namespace {

template <typename T, typename A>
void scatter_add_typed(const T* x, const Shape& xs, const IndexView& index, const Shape& is,
                       const T* src, const Shape& ss, int64_t axis, A* acc) {
  // acc holds x (in the accumulation type); contributions are added in index order for each
  // element. Threads split the work so that no two write one element: by the dims before the
  // axis when there are enough of them (each owns its rows of x), else by the dims after it
  // (each owns columns), walking the index in order within its part.
  const size_t r = is.size();
  const std::vector<int64_t> xst = contiguous_strides(xs), sst = contiguous_strides(ss);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= is[d];
  for (size_t d = static_cast<size_t>(axis) + 1; d < r; ++d) inner *= is[d];
  const int64_t len = is[axis];
  const int64_t n = outer * len * inner;
  if (n == 0) return;
  auto add = [](A& a, T v) {
    if constexpr (std::is_same_v<T, bool>)
      a = a || v;
    else if constexpr (std::is_integral_v<T>)
      a = static_cast<A>(static_cast<std::make_unsigned_t<A>>(a) +
                         static_cast<std::make_unsigned_t<A>>(v));
    else
      a = static_cast<A>(a + static_cast<A>(v));
  };
  (void)x;
  const int threads = n > 32768 ? omp_get_max_threads() : 1;
  const bool by_outer = outer >= threads;
  // The common case walks rows instead of elements: the dims after the axis are the same in x,
  // src and the index, so position c after the axis is element c of each row, and the index is
  // one value per row (an embedding's gradient: the index broadcast over the row) or a whole
  // contiguous row.
  bool rows = true;
  bool one_per_row = true, whole_rows = true;
  int64_t contiguous = 1;
  for (size_t d = r; d-- > static_cast<size_t>(axis) + 1;) {
    rows = rows && xs[d] == is[d] && ss[d] == is[d];
    one_per_row = one_per_row && (index.strides[d] == 0 || is[d] == 1);
    whole_rows = whole_rows && (index.strides[d] == contiguous || is[d] == 1);
    contiguous *= is[d];
  }
  rows = rows && (one_per_row || whole_rows);
  auto run = [&](int64_t o0, int64_t o1, int64_t i0, int64_t i1) {
    for (int64_t o = o0; o < o1; ++o) {
      int64_t xo = 0, so = 0, io = 0;
      int64_t pos = o;
      for (int64_t d = axis; d-- > 0;) {
        const int64_t i = pos % is[d];
        pos /= is[d];
        xo += i * xst[d];
        so += i * sst[d];
        io += i * index.strides[d];
      }
      if (rows) {
        for (int64_t k = 0; k < len; ++k) {
          const int64_t* at = index.data + io + k * index.strides[axis];
          const T* from = src + so + k * sst[axis];
          if (one_per_row) {
            A* to = acc + xo + at[0] * xst[axis];
            for (int64_t c = i0; c < i1; ++c) add(to[c], from[c]);
          } else {
            for (int64_t c = i0; c < i1; ++c) add(acc[xo + at[c] * xst[axis] + c], from[c]);
          }
        }
        continue;
      }
      for (int64_t k = 0; k < len; ++k)
        for (int64_t c = i0; c < i1; ++c) {
          int64_t xc = 0, sc = 0, ic = 0;
          int64_t p = c;
          for (size_t d = r; d-- > static_cast<size_t>(axis) + 1;) {
            const int64_t i = p % is[d];
            p /= is[d];
            xc += i * xst[d];
            sc += i * sst[d];
            ic += i * index.strides[d];
          }
          const int64_t at = index.data[io + k * index.strides[axis] + ic];
          add(acc[xo + at * xst[axis] + xc], src[so + k * sst[axis] + sc]);
        }
    }
  };
  if (threads == 1) {
    run(0, outer, 0, inner);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t total = by_outer ? outer : inner;
    const int64_t b = total * t / nt, e = total * (t + 1) / nt;
    if (by_outer)
      run(b, e, 0, inner);
    else
      run(0, outer, b, e);
  }
}

}  // namespace

void scatter_add(DType dtype, const void* x, const Shape& xs, const IndexView& index,
                 const Shape& is, const void* src, const Shape& ss, int64_t axis, void* out) {
  const int64_t n = shape_numel(xs);
  auto same = [&](auto tag) {
    using T = decltype(tag);
    if (out != x && n) std::memcpy(out, x, static_cast<size_t>(n) * sizeof(T));
    scatter_add_typed<T, T>(static_cast<const T*>(x), xs, index, is, static_cast<const T*>(src), ss,
                            axis, static_cast<T*>(out));
  };
  switch (dtype) {
    case DType::F32:
      return same(float{});
    case DType::F64:
      return same(double{});
    case DType::I32:
      return same(int32_t{});
    case DType::I64:
      return same(int64_t{});
    case DType::Bool:
      return same(bool{});
    case DType::U8:
      return same(uint8_t{});
    case DType::BF16: {
      // Widened to f32, summed, rounded once (ref's definition of a bf16 op).
      std::vector<float> acc(static_cast<size_t>(n));
      bf16_to_f32(static_cast<const uint16_t*>(x), n, acc.data());
      std::vector<float> wide(static_cast<size_t>(shape_numel(ss)));
      bf16_to_f32(static_cast<const uint16_t*>(src), shape_numel(ss), wide.data());
      scatter_add_typed<float, float>(nullptr, xs, index, is, wide.data(), ss, axis, acc.data());
      f32_to_bf16(acc.data(), n, static_cast<uint16_t*>(out));
      return;
    }
  }
}

void pad(size_t elem, const void* x, const Shape& xs, const std::vector<int64_t>& attrs,
         const void* value, const Shape& os, void* out) {
  const int64_t n = shape_numel(os);
  if (n == 0) return;
  const size_t r = os.size();
  const std::vector<int64_t> xst = contiguous_strides(xs);
  const int64_t last = os[r - 1], rows = n / last;
  const int64_t before = attrs[2 * (r - 1)];
  // The run of the last dim that comes from x: [lo, hi) of the output row.
  const int64_t lo = std::clamp<int64_t>(before, 0, last);
  const int64_t hi = std::clamp<int64_t>(before + xs[r - 1], lo, last);
  by_size(elem, [&](auto tag) {
    using E = decltype(tag);
    const E v = *static_cast<const E*>(value);
    const E* X = static_cast<const E*>(x);
    E* Y = static_cast<E*>(out);
    parallel_for(n * static_cast<int64_t>(elem) > kParallelBytes, rows, [&](int64_t row) {
      E* y = Y + row * last;
      int64_t xo = 0, pos = row;
      bool inside = true;
      for (size_t d = r - 1; d-- > 0;) {
        const int64_t i = pos % os[d] - attrs[2 * d];
        pos /= os[d];
        inside = inside && i >= 0 && i < xs[d];
        xo += i * xst[d];
      }
      if (!inside || lo == hi) {
        std::fill(y, y + last, v);
        return;
      }
      std::fill(y, y + lo, v);
      std::memcpy(y + lo, X + xo + (lo - before), static_cast<size_t>(hi - lo) * sizeof(E));
      std::fill(y + hi, y + last, v);
    });
  });
}

void concat(size_t elem, const std::vector<const void*>& xs, const std::vector<Shape>& shapes,
            int64_t axis, const Shape& os, void* out) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= os[d];
  for (size_t d = static_cast<size_t>(axis) + 1; d < os.size(); ++d) inner *= os[d];
  const int64_t out_row = os[axis] * inner * static_cast<int64_t>(elem);
  std::vector<int64_t> at(xs.size()), row(xs.size());
  int64_t acc = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    at[k] = acc;
    row[k] = shapes[k][axis] * inner * static_cast<int64_t>(elem);
    acc += row[k];
  }
  const int64_t parts = outer * static_cast<int64_t>(xs.size());
  char* Y = static_cast<char*>(out);
  parallel_for(outer * out_row > kParallelBytes, parts, [&](int64_t p) {
    const int64_t o = p / static_cast<int64_t>(xs.size());
    const size_t k = static_cast<size_t>(p % static_cast<int64_t>(xs.size()));
    const char* from = static_cast<const char*>(xs[k]) + o * row[k];
    char* to = Y + o * out_row + at[k];
    if (row[k] && from != to) std::memcpy(to, from, static_cast<size_t>(row[k]));  // in place
  });
}

void iota(DType dtype, const Shape& shape, int64_t axis, void* out) {
  const int64_t n = shape_numel(shape);
  const int64_t stride = contiguous_strides(shape)[static_cast<size_t>(axis)];
  const int64_t size = shape[static_cast<size_t>(axis)];
  auto fill = [&](auto tag) {
    using T = decltype(tag);
    T* Y = static_cast<T*>(out);
    parallel_for(n > 65536, n, [&](int64_t i) { Y[i] = static_cast<T>((i / stride) % size); });
  };
  switch (dtype) {
    case DType::F32:
      return fill(float{});
    case DType::F64:
      return fill(double{});
    case DType::I32:
      return fill(int32_t{});
    case DType::I64:
      return fill(int64_t{});
    case DType::Bool:
      return fill(bool{});
    case DType::U8:
      return fill(uint8_t{});
    case DType::BF16: {
      uint16_t* Y = static_cast<uint16_t*>(out);
      parallel_for(n > 65536, n, [&](int64_t i) {
        Y[i] = bfloat16(static_cast<float>((i / stride) % size)).bits;
      });
      return;
    }
  }
}

namespace {

// An element as the value it holds: bf16, dispatched as its bits (by_dtype<uint16_t>), widened.
template <typename T>
inline auto value_of(T v) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return bf16_value(v);
  else
    return v;
}
template <typename V>
inline bool is_nan(V v) {
  if constexpr (std::is_floating_point_v<V>)
    return v != v;
  else
    return false;
}

}  // namespace

void arg_reduce(bool is_max, DType dtype, const void* x, const Shape& xs,
                const std::vector<int64_t>& attrs, int64_t* out) {
  const ReduceLayout l = reduce_layout(xs, attrs);
  int64_t block = l.inner;
  for (int64_t d : l.rdim) block *= d;
  by_dtype<uint16_t>(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* X = static_cast<const T*>(x);
    parallel_for(l.outer * block > 32768, l.outer, [&](int64_t o) {
      int64_t base = 0, pos = o;
      for (size_t d = l.kdim.size(); d-- > 0;) {
        base += pos % l.kdim[d] * l.kstride[d];
        pos /= l.kdim[d];
      }
      decltype(value_of(T{})) best{};
      int64_t at = -1, count = 0;
      const int64_t runs = block / l.inner;
      for (int64_t r = 0; r < runs; ++r) {
        int64_t off = base, rest = r;
        for (size_t d = l.rdim.size(); d-- > 0;) {
          off += rest % l.rdim[d] * l.rstride[d];
          rest /= l.rdim[d];
        }
        for (int64_t j = 0; j < l.inner; ++j, ++count) {
          const auto v = value_of(X[off + j]);
          const bool take =
              at < 0 || (!is_nan(best) && (is_nan(v) || (is_max ? v > best : v < best)));
          if (take) {
            best = v;
            at = count;
          }
        }
      }
      out[o] = at;
    });
  });
}

void argsort(DType dtype, const void* x, const Shape& xs, int64_t axis, bool descending,
             int64_t* out) {
  const int64_t len = xs.empty() ? 1 : xs[static_cast<size_t>(axis)];
  const int64_t inner = xs.empty() ? 1 : contiguous_strides(xs)[static_cast<size_t>(axis)];
  const int64_t total = shape_numel(xs);
  const int64_t outer = len * inner == 0 ? 0 : total / (len * inner);
  by_dtype<uint16_t>(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* X = static_cast<const T*>(x);
    const bool down = descending;  // (clang's OpenMP: the sort's lambda captures this lambda's)
    parallel_region(total > 16384, [&] {
      std::vector<int64_t> order(static_cast<size_t>(len));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < outer * inner; ++row) {
        const int64_t base = row / inner * len * inner + row % inner;
        for (int64_t k = 0; k < len; ++k) order[static_cast<size_t>(k)] = k;
        // NaN is the largest value (PyTorch's order); ties keep their order (stable).
        auto above = [&](int64_t a, int64_t b) {
          const auto va = value_of(X[base + a * inner]), vb = value_of(X[base + b * inner]);
          if (is_nan(va)) return !is_nan(vb);
          if (is_nan(vb)) return false;
          return va > vb;
        };
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return down ? above(a, b) : above(b, a); });
        for (int64_t k = 0; k < len; ++k) out[base + k * inner] = order[static_cast<size_t>(k)];
      }
    });
  });
}

void random_uniform(DType dtype, const int64_t* state, int64_t count, void* out) {
  const uint64_t seed = static_cast<uint64_t>(state[0]);
  const uint64_t counter = static_cast<uint64_t>(state[1]);
  parallel_for(count > 16384, count, [&](int64_t i) {
    const uint64_t c = counter + static_cast<uint64_t>(i);
    if (dtype == DType::F32)
      static_cast<float*>(out)[i] = ir::random_uniform_f32(seed, c);
    else if (dtype == DType::BF16)
      static_cast<uint16_t*>(out)[i] = bfloat16(ir::random_uniform_bf16(seed, c)).bits;
    else
      static_cast<double*>(out)[i] = ir::random_uniform_f64(seed, c);
  });
}

}  // namespace lockstep::backends::cpu
