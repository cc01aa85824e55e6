// PyTorch's x[...] in full (getitem) and its assignment (index_put): basic indices go through
// ls::index; integer tensors, masks and bools become gathers from x flattened over their axes, and
// assignments scatters of positions, all recorded. Not here: basic indexing itself
// (composites.cpp), the parsing of a Python key (python/src/indexing.cpp).
#include <algorithm>
#include <optional>
#include <string>
#include <variant>

#include "tensor/frontend.h"
#include "util/check.h"
#include "util/frames.h"

namespace lockstep {

using frontend::node;
using util::cat;

namespace {

// An advanced index of y (x after the basic indices): i64 or i32 indices of any shape for `axis`.
struct Advanced {
  int64_t axis;
  Tensor index;
};

// What the key does to x: `y` is x after its basic indices, with a size-1 axis for each bool and
// each integer tensor's and mask's axes still whole; the advanced indices of y's axes remain.
struct Parsed {
  Tensor y;
  std::vector<Advanced> advanced;  // ascending axes
  bool may_repeat = false;         // whether two entries of x[key] may be the same element
};

const char* index_dtypes = "Use an i64 or i32 tensor of indices, or a bool (or u8) mask";

// The axes of x an item names.
int64_t axes_named(const IndexItem& item, const Loc& loc) {
  const auto& v = item.value();
  if (const TensorIndex* t = std::get_if<TensorIndex>(&v))
    return std::holds_alternative<int64_t>(t->value()) || std::holds_alternative<Slice>(t->value());
  if (std::holds_alternative<bool>(v)) return 0;
  const Tensor& t = std::get<Tensor>(v);
  const frontend::NodePtr n = node(t, "index", loc);
  if (n->dtype == DType::Bool) return static_cast<int64_t>(n->shape.size());
  if (n->dtype != DType::I64 && n->dtype != DType::I32)
    util::fail(loc, "index",
               cat("tensors used as indices must be i64, i32, bool or u8, got ",
                   dtype_name(n->dtype), shape_str(n->shape)),
               index_dtypes);
  return 1;
}

// Indices (broadcast to `shape`) into an axis of size 0 are an error even where nothing is taken
// (PyTorch's rule); none are not.
void check_not_empty(const Shape& shape, int64_t size, const Loc& loc) {
  if (size == 0 && shape_numel(shape) > 0)
    util::fail(loc, "index", cat("indices ", shape_str(shape), " into an axis of size 0"),
               "Nothing can be selected from an empty axis");
}

// The i64 positions `index` names along an axis of `size` (negative ones from the end), taken from
// a ramp 0..size-1 by a gather, so that one out of range fails when the step runs.
Tensor checked(const Tensor& index, int64_t size, Device device, const Loc& loc) {
  Tensor i = cast(index, DType::I64, loc);
  i = where(lt(i, 0, loc), add(i, size, loc), i, loc);
  const Tensor ramp = arange(size, TensorOptions(DType::I64, device), loc);
  return reshape(gather(ramp, 0, reshape(i, {-1}, loc), loc), index.shape(), loc);
}

// The positions (one i64 tensor per axis) of a mask's true entries, in row-major order: a read.
std::vector<Tensor> nonzero(const Tensor& mask, Device device, const Loc& loc) {
  const Shape& m = mask.shape();
  const std::vector<bool> values = mask.to_vector<bool>(loc);
  std::vector<std::vector<int64_t>> at(m.size());
  for (size_t f = 0; f < values.size(); ++f) {
    if (!values[f]) continue;
    size_t rest = f;
    for (size_t a = m.size(); a-- > 0;) {
      at[a].push_back(static_cast<int64_t>(rest % static_cast<size_t>(m[a])));
      rest /= static_cast<size_t>(m[a]);
    }
  }
  std::vector<Tensor> out;
  for (const std::vector<int64_t>& positions : at)
    out.push_back(
        from_vector(positions, Shape{static_cast<int64_t>(positions.size())}, device, loc));
  return out;
}

void check_mask(const Tensor& mask, const Shape& y, int64_t axis, int64_t item, const Loc& loc) {
  const Shape& m = mask.shape();
  if (!std::equal(m.begin(), m.end(), y.begin() + axis))
    util::fail(loc, "index",
               cat("the mask ", shape_str(m), " (index ", item, ") does not match the axes ", axis,
                   ".. of the indexed tensor ", shape_str(y)),
               "A mask needs the sizes of the axes it indexes");
}

Parsed parse(const Tensor& x, const std::vector<IndexItem>& key, const Loc& loc) {
  const frontend::NodePtr xn = node(x, "index", loc);
  const int64_t rank = static_cast<int64_t>(xn->shape.size());
  int64_t named = 0;
  for (const IndexItem& item : key) named += axes_named(item, loc);
  if (named > rank)
    util::fail(loc, "index",
               cat("too many indices (", named, " axes) for a tensor of rank ", rank, " (",
                   shape_str(xn->shape), ")"),
               "Index at most the axes the tensor has");
  // Basic indices as ls::index takes them: a tensor's axes whole, a bool a new axis.
  std::vector<TensorIndex> basic;
  struct Pending {
    int64_t axis, item;
    Tensor index;  // an integer tensor, a mask, or none for a bool
    bool value;
  };
  std::vector<Pending> pending;
  int64_t axis = 0;    // of y
  int64_t x_axis = 0;  // of x
  for (size_t k = 0; k < key.size(); ++k) {
    const auto& v = key[k].value();
    const int64_t item = static_cast<int64_t>(k);
    if (const TensorIndex* t = std::get_if<TensorIndex>(&v)) {
      basic.push_back(*t);
      if (const int64_t* i = std::get_if<int64_t>(&t->value())) {
        const int64_t size = xn->shape[x_axis];  // named <= rank: x_axis < rank
        if (*i < -size || *i >= size)
          util::fail(loc, "index",
                     cat("index ", *i, " is out of range for axis ", x_axis, " of size ", size,
                         " (the tensor is ", shape_str(xn->shape), ")"),
                     cat("Use -", size, " <= index < ", size));
        ++x_axis;
      } else if (std::holds_alternative<EllipsisIndex>(t->value())) {
        axis += rank - named;
        x_axis += rank - named;
      } else if (std::holds_alternative<Slice>(t->value())) {
        ++axis;
        ++x_axis;
      } else {
        ++axis;
      }
    } else if (const bool* b = std::get_if<bool>(&v)) {
      basic.emplace_back(None);
      pending.push_back({axis++, item, Tensor(), *b});
    } else {
      const Tensor& t = std::get<Tensor>(v);
      if (t.dtype() == DType::Bool && t.dim() == 0) {
        basic.emplace_back(None);
        pending.push_back({axis++, item, Tensor(), t.item<bool>(loc)});
        continue;
      }
      const int64_t k_axes = t.dtype() == DType::Bool ? t.dim() : 1;
      for (int64_t i = 0; i < k_axes; ++i) basic.emplace_back(Slice());
      pending.push_back({axis, item, t, false});
      axis += k_axes;
      x_axis += k_axes;
    }
  }
  Parsed p{index(x, basic, loc), {}};
  const Device device = xn->device;
  const Shape y = p.y.shape();
  // 0-d integer tensors select (an integer's meaning), from the last so that axes stay put.
  std::vector<int64_t> selected;
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    if (!it->index.defined() || it->index.dtype() == DType::Bool || it->index.dim() != 0) continue;
    check_not_empty({1}, y[it->axis], loc);
    const Tensor at = reshape(checked(it->index, y[it->axis], device, loc), {1}, loc);
    p.y = squeeze(index_select(p.y, it->axis, at, loc), it->axis, loc);
    selected.push_back(it->axis);
  }
  auto shifted = [&](int64_t a) {
    return a - static_cast<int64_t>(std::count_if(selected.begin(), selected.end(),
                                                  [&](int64_t s) { return s < a; }));
  };
  int64_t masks = 0, others = 0;
  for (const Pending& q : pending) {
    const int64_t a = shifted(q.axis);
    if (!q.index.defined()) {
      p.advanced.push_back({a, zeros({q.value ? 1 : 0}, TensorOptions(DType::I64, device), loc)});
      ++others;
    } else if (q.index.dtype() == DType::Bool) {
      check_mask(q.index, p.y.shape(), a, q.item, loc);
      std::vector<Tensor> at = nonzero(q.index, device, loc);
      for (size_t i = 0; i < at.size(); ++i)
        p.advanced.push_back({a + static_cast<int64_t>(i), std::move(at[i])});
      ++masks;
    } else if (q.index.dim() != 0) {
      p.advanced.push_back({a, q.index});
      ++others;
    }
  }
  p.may_repeat = others > 0 || masks > 1;
  return p;
}

// y's entries at the advanced indices: y flattened over their axes, gathered at the positions
// they name together.
Tensor take(const Parsed& p, const Loc& loc) {
  const Shape& y = p.y.shape();
  const Device device = p.y.device();
  Shape b = p.advanced[0].index.shape();
  for (const Advanced& a : p.advanced) {
    try {
      b = frontend::broadcast_shapes(b, a.index.shape(), "index", loc);
    } catch (const Error&) {
      std::string shapes;
      for (const Advanced& c : p.advanced)
        shapes += (shapes.empty() ? "" : ", ") + shape_str(c.index.shape());
      util::fail(loc, "index", cat("the index tensors ", shapes, " do not broadcast together"),
                 "Give index tensors of shapes that broadcast (as NumPy's)");
    }
  }
  std::vector<int64_t> perm;
  Shape rest_shape;
  bool adjacent = true;
  int64_t flat = 1;
  for (size_t i = 0; i < p.advanced.size(); ++i) {
    const int64_t a = p.advanced[i].axis;
    perm.push_back(a);
    adjacent = adjacent && (i == 0 || a == p.advanced[i - 1].axis + 1);
    flat *= y[a];
    check_not_empty(b, y[a], loc);
  }
  for (int64_t a = 0; a < static_cast<int64_t>(y.size()); ++a)
    if (std::find(perm.begin(), perm.end(), a) == perm.end()) {
      perm.push_back(a);
      rest_shape.push_back(y[a]);
    }
  Shape out_shape = b;
  out_shape.insert(out_shape.end(), rest_shape.begin(), rest_shape.end());
  Shape z_shape = {flat};
  z_shape.insert(z_shape.end(), rest_shape.begin(), rest_shape.end());
  const Tensor z = reshape(permute(p.y, perm, loc), z_shape, loc);
  Tensor out;
  if (shape_numel(out_shape) == 0) {
    // Nothing is taken, so no index is checked (as PyTorch's x[2:1, [5]] is empty, not an error);
    // y's own checks (a 0-d tensor's select) still run.
    out = reshape(slice(z, 0, 0, 0, 1, loc), out_shape, loc);
  } else {
    Tensor at;  // the positions in y flattened over the advanced axes, row-major
    for (const Advanced& a : p.advanced) {
      const Tensor c = expand(checked(a.index, y[a.axis], device, loc), b, loc);
      at = at.defined() ? add(mul(at, y[a.axis], loc), c, loc) : c;
    }
    out = reshape(index_select(z, 0, reshape(at, {-1}, loc), loc), out_shape, loc);
  }
  const int64_t first = p.advanced[0].axis;
  if (adjacent && first > 0 && !b.empty()) {
    std::vector<int64_t> from, to;
    for (int64_t i = 0; i < static_cast<int64_t>(b.size()); ++i) {
      from.push_back(i);
      to.push_back(first + i);
    }
    out = movedim(out, from, to, loc);
  }
  return out;
}

Tensor getitem_as(const Tensor& x, const std::vector<IndexItem>& key, bool* may_repeat,
                  const Loc& loc) {
  Parsed p = parse(x, key, loc);
  if (may_repeat) *may_repeat = p.may_repeat;
  return p.advanced.empty() ? p.y : take(p, loc);
}

// Whether x[key] is all of x (only full slices and an Ellipsis).
bool whole(const std::vector<IndexItem>& key) {
  return std::all_of(key.begin(), key.end(), [](const IndexItem& item) {
    const TensorIndex* t = std::get_if<TensorIndex>(&item.value());
    if (!t) return false;
    if (std::holds_alternative<EllipsisIndex>(t->value())) return true;
    const Slice* s = std::get_if<Slice>(&t->value());
    return s && !s->start && !s->stop && s->step == 1;
  });
}

// `values` without its leading size-1 axes beyond `rank`, as PyTorch's assignment takes them.
Tensor fitted(Tensor values, size_t rank, const Loc& loc) {
  while (values.shape().size() > rank && values.shape()[0] == 1) values = squeeze(values, 0, loc);
  return values;
}

void check_fits(const Shape& values, const Shape& target, const Loc& loc) {
  bool fits = values.size() <= target.size();
  for (size_t i = 0; fits && i < values.size(); ++i) {
    const int64_t v = values[values.size() - 1 - i], t = target[target.size() - 1 - i];
    fits = v == t || v == 1;
  }
  if (!fits)
    util::fail(loc, "index_put",
               cat("values of shape ", shape_str(values), " do not broadcast to the indexed shape ",
                   shape_str(target)),
               "Give values of the indexed shape, or one that broadcasts to it");
}

// The one mask of a key that has no other advanced index, with the number of y's axes before it.
struct LoneMask {
  size_t item;
  int64_t axis;
};
std::optional<LoneMask> lone_mask(const Tensor& x, const std::vector<IndexItem>& key,
                                  const Loc& loc) {
  std::optional<LoneMask> found;
  int64_t named = 0;
  for (const IndexItem& item : key) named += axes_named(item, loc);
  int64_t axis = 0;
  for (size_t k = 0; k < key.size(); ++k) {
    const auto& v = key[k].value();
    if (const TensorIndex* t = std::get_if<TensorIndex>(&v)) {
      if (std::holds_alternative<EllipsisIndex>(t->value()))
        axis += x.dim() - named;
      else if (!std::holds_alternative<int64_t>(t->value()))
        ++axis;
      continue;
    }
    const Tensor* t = std::get_if<Tensor>(&v);
    if (!t || t->dtype() != DType::Bool || t->dim() == 0 || found) return std::nullopt;
    found = LoneMask{k, axis};
    axis += t->dim();
  }
  return found;
}

// The key with uint8 tensors as the masks PyTorch takes them for (there with a deprecation).
std::vector<IndexItem> with_masks(std::vector<IndexItem> key, const Loc& loc) {
  for (IndexItem& item : key)
    if (const Tensor* t = std::get_if<Tensor>(&item.value()); t && t->dtype() == DType::U8)
      item = IndexItem(ne(*t, 0, loc));
  return key;
}

}  // namespace

Tensor getitem(const Tensor& x, const std::vector<IndexItem>& key, Loc loc) {
  const util::UserOp user_op("index");
  return getitem_as(x, with_masks(key, loc), nullptr, loc);
}

Tensor index_put(const Tensor& x, const std::vector<IndexItem>& key_given, const Tensor& values,
                 bool accumulate, Loc loc) {
  const util::UserOp user_op("index_put");
  const std::vector<IndexItem> key = with_masks(key_given, loc);
  const frontend::NodePtr xn = node(x, "index_put", loc);
  const TensorOptions i64(DType::I64, xn->device);
  Tensor v = cast(values, xn->dtype, loc);
  if (!accumulate && whole(key)) {
    getitem_as(x, key, nullptr, loc);  // the key's own errors (two ellipses)
    v = fitted(v, xn->shape.size(), loc);
    check_fits(v.shape(), xn->shape, loc);
    return expand(v, xn->shape, loc);
  }
  // A lone mask with values that do not span its entries: a where over the axes it covers, no read.
  if (std::optional<LoneMask> m = accumulate ? std::nullopt : lone_mask(x, key, loc)) {
    const Tensor& mask = std::get<Tensor>(key[m->item].value());
    std::vector<IndexItem> covered = key;
    covered[m->item] = Slice();
    covered.insert(covered.begin() + static_cast<std::ptrdiff_t>(m->item) + 1,
                   static_cast<size_t>(mask.dim() - 1), IndexItem(Slice()));
    const Tensor sub = getitem_as(x, covered, nullptr, loc);
    const Shape& s = sub.shape();
    check_mask(mask, s, m->axis, static_cast<int64_t>(m->item), loc);
    const int64_t after = static_cast<int64_t>(s.size()) - m->axis - mask.dim();
    v = fitted(v, static_cast<size_t>(after + 1 + m->axis), loc);
    const int64_t at = v.dim() - 1 - after;  // v's axis along the mask's entries
    if (at < 0 || v.shape()[static_cast<size_t>(at)] == 1) {
      Shape target(s.begin(), s.begin() + m->axis);
      target.push_back(1);
      target.insert(target.end(), s.end() - after, s.end());
      check_fits(v.shape(), target, loc);
      if (at >= 0) {
        Shape spread = v.shape();
        spread.erase(spread.begin() + at);
        spread.insert(spread.begin() + at, static_cast<size_t>(mask.dim()), 1);
        v = reshape(v, spread, loc);
      }
      Shape mask_shape(static_cast<size_t>(m->axis), 1);
      mask_shape.insert(mask_shape.end(), mask.shape().begin(), mask.shape().end());
      mask_shape.insert(mask_shape.end(), static_cast<size_t>(after), 1);
      const Tensor replaced = where(reshape(mask, mask_shape, loc), v, sub, loc);
      return index_put(x, covered, replaced, false, loc);
    }
  }
  // The general case: the positions x[key] takes, scattered to name what each element receives.
  bool may_repeat = false;
  const int64_t n = x.numel();
  const Tensor at = getitem_as(reshape(arange(n, i64, loc), xn->shape, loc), key, &may_repeat, loc);
  v = fitted(v, at.shape().size(), loc);
  check_fits(v.shape(), at.shape(), loc);
  const int64_t count = at.numel();
  const Tensor flat_at = reshape(at, {-1}, loc);
  const Tensor flat_x = reshape(x, {-1}, loc);
  // Nothing is written; x[key]'s own checks (a 0-d tensor's select) still run.
  if (count == 0)
    return reshape(concat({flat_x, cast(flat_at, xn->dtype, loc)}, 0, loc), xn->shape, loc);
  const Tensor flat_v = reshape(expand(v, at.shape(), loc), {-1}, loc);
  if (accumulate) return reshape(scatter_add(flat_x, 0, flat_at, flat_v, loc), xn->shape, loc);
  // source[e]: 1 + the entry of values that element e of x receives, 0 for none. Of repeated
  // positions the last entry wins: after a stable sort, the last of each run.
  Tensor source;
  if (may_repeat && count > 1) {
    const ValuesIndices sorted = sort(flat_at, 0, false, loc);
    const Tensor& s = sorted.values;
    const Tensor last =
        concat({ne(slice(s, 0, 0, count - 1, 1, loc), slice(s, 0, 1, count, 1, loc), loc),
                ones({1}, TensorOptions(DType::Bool, xn->device), loc)},
               0, loc);
    source = scatter_add(zeros({n}, i64, loc), 0, s,
                         where(last, add(sorted.indices, 1, loc), 0, loc), loc);
  } else {
    source = scatter_add(zeros({n}, i64, loc), 0, flat_at, arange(1, count + 1, 1, i64, loc), loc);
  }
  const Tensor taken = index_select(flat_v, 0, clamp_min(sub(source, 1, loc), 0, loc), loc);
  return reshape(where(gt(source, 0, loc), taken, flat_x, loc), xn->shape, loc);
}

Tensor index_put(const Tensor& x, const std::vector<IndexItem>& key, Scalar value, Loc loc) {
  const DType natural = value.is_bool()      ? DType::Bool
                        : value.is_integer() ? DType::I64
                                             : DType::F64;
  return index_put(x, key, scalar_tensor(value, TensorOptions(natural, x.device()), loc), false,
                   loc);
}

}  // namespace lockstep
