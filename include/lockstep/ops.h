// The operations users record. Each checks shapes, dtypes and axes at the call and throws
// Error naming the op, the shapes and the fix; none computes anything (see runtime.h).
// Primitives map to one IR op; composites (mean, softmax, clamp, ...) are built from primitives.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep {

// ---- creation ----------------------------------------------------------------------------
Tensor zeros(const Shape& shape, TensorOptions options = {}, Loc loc = Loc::current());
Tensor ones(const Shape& shape, TensorOptions options = {}, Loc loc = Loc::current());
Tensor full(const Shape& shape, Scalar value, TensorOptions options = {}, Loc loc = Loc::current());
Tensor zeros_like(const Tensor& t, Loc loc = Loc::current());
Tensor ones_like(const Tensor& t, Loc loc = Loc::current());
Tensor full_like(const Tensor& t, Scalar value, Loc loc = Loc::current());
// A new handle holding t's value, bit for bit in every dtype (torch.clone): gradients flow
// through it to t; since tensors are never views, an in-place update of either one later leaves
// the other's value as it was.
Tensor clone(const Tensor& t, Loc loc = Loc::current());
// A 0-d tensor holding `value` (a runtime input, not a constant of the program).
Tensor scalar_tensor(Scalar value, TensorOptions options = {}, Loc loc = Loc::current());
// [0, end) and [start, end) by step, like numpy.arange.
Tensor arange(Scalar end, TensorOptions options = {DType::I64}, Loc loc = Loc::current());
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options = {DType::I64},
              Loc loc = Loc::current());
// `steps` values from start to end inclusive, evenly spaced (torch.linspace).
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {},
                Loc loc = Loc::current());
// Copies host data. `shape` may be empty for a 1-d tensor of data.size() elements.
template <typename T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape = {},
                   Device device = default_device(), Loc loc = Loc::current());
Tensor from_blob(const void* data, const Shape& shape, DType dtype, Device device,
                 Loc loc = Loc::current());

// Random numbers from a counter-based generator, whose state is a tensor: drawing in a step
// never recompiles it, and a step's rollback restores the state. Each thread has its own
// generator, so threads training their own models share no tensor: it starts from the seed of
// the last manual_seed call made before the thread's first draw (0 if none), and manual_seed
// reseeds the calling thread's generator (give threads different seeds for different streams).
void manual_seed(uint64_t seed);
Tensor rand(const Shape& shape, TensorOptions options = {}, Loc loc = Loc::current());
Tensor randn(const Shape& shape, TensorOptions options = {}, Loc loc = Loc::current());
// The same with t's shape, dtype and device (torch.rand_like, torch.randn_like).
Tensor rand_like(const Tensor& t, Loc loc = Loc::current());
Tensor randn_like(const Tensor& t, Loc loc = Loc::current());
// Integers uniform in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = {DType::I64},
               Loc loc = Loc::current());
// 1 with probability p, else 0, in p's (floating) dtype: torch.bernoulli(p). The second form
// draws with one probability for every element of x's shape and dtype (x.bernoulli(p)).
Tensor bernoulli(const Tensor& p, Loc loc = Loc::current());
Tensor bernoulli(const Tensor& x, double p, Loc loc = Loc::current());
// torch.multinomial: num_samples category indices (i64) per row of `weights` ([K] or [B, K],
// non-negative, any positive sum), drawn with probability proportional to the weights, with or
// without replacement (then no category twice in a row, and num_samples <= K; categories of
// weight 0 come only once the others are drawn, as PyTorch's). Costs O(B * num_samples * K)
// with replacement, a sort of each row without. The weights are not read to be checked (that
// would be a sync): a row with a negative, NaN or infinite weight, or all zero, gives categories
// in [0, K) that follow no distribution.
Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement = false,
                   Loc loc = Loc::current());
// The calling thread's generator state (i64[2]: seed, counter), e.g. to save it in a checkpoint.
Tensor& generator_state();

// ---- elementwise ---------------------------------------------------------------------------
Tensor neg(const Tensor& x, Loc loc = Loc::current());
Tensor abs(const Tensor& x, Loc loc = Loc::current());
Tensor exp(const Tensor& x, Loc loc = Loc::current());
Tensor log(const Tensor& x, Loc loc = Loc::current());
// log(1 + x), accurate for small x.
Tensor log1p(const Tensor& x, Loc loc = Loc::current());
Tensor sqrt(const Tensor& x, Loc loc = Loc::current());
Tensor rsqrt(const Tensor& x, Loc loc = Loc::current());
Tensor tanh(const Tensor& x, Loc loc = Loc::current());
Tensor sigmoid(const Tensor& x, Loc loc = Loc::current());
Tensor relu(const Tensor& x, Loc loc = Loc::current());
Tensor sin(const Tensor& x, Loc loc = Loc::current());
Tensor cos(const Tensor& x, Loc loc = Loc::current());
// The error function (torch.erf); its gradient 2/sqrt(pi) exp(-x^2) is recomputed from x.
Tensor erf(const Tensor& x, Loc loc = Loc::current());
Tensor floor(const Tensor& x, Loc loc = Loc::current());
Tensor ceil(const Tensor& x, Loc loc = Loc::current());
Tensor sign(const Tensor& x, Loc loc = Loc::current());
Tensor logical_not(const Tensor& x, Loc loc = Loc::current());
Tensor isfinite(const Tensor& x, Loc loc = Loc::current());
Tensor square(const Tensor& x, Loc loc = Loc::current());

// Binary ops broadcast like NumPy and promote dtypes as PyTorch does (torch.result_type): the
// higher category of bool < integer < floating wins, then the larger size (i32 + i64 is i64,
// f32 + f64 is f64); a 0-d tensor or a scalar counts only when its category is above the other
// operand's (f32[3] + f64 0-d is f32, i64[3] * 2.5 is f32, bool + 1 is i64). `div` is true
// division: integers divide as f32 (floor_divide keeps integers).
#define LOCKSTEP_BINARY_DECL(name)                                         \
  Tensor name(const Tensor& a, const Tensor& b, Loc loc = Loc::current()); \
  Tensor name(const Tensor& a, Scalar b, Loc loc = Loc::current());        \
  Tensor name(Scalar a, const Tensor& b, Loc loc = Loc::current());
LOCKSTEP_BINARY_DECL(add)
LOCKSTEP_BINARY_DECL(sub)
LOCKSTEP_BINARY_DECL(mul)
LOCKSTEP_BINARY_DECL(div)
LOCKSTEP_BINARY_DECL(pow)
LOCKSTEP_BINARY_DECL(maximum)
LOCKSTEP_BINARY_DECL(minimum)
LOCKSTEP_BINARY_DECL(eq)
LOCKSTEP_BINARY_DECL(ne)
LOCKSTEP_BINARY_DECL(lt)
LOCKSTEP_BINARY_DECL(le)
LOCKSTEP_BINARY_DECL(gt)
LOCKSTEP_BINARY_DECL(ge)
LOCKSTEP_BINARY_DECL(logical_and)
LOCKSTEP_BINARY_DECL(logical_or)
// C's fmod (the remainder has the sign of a) and Python's % (the sign of b), as torch.fmod and
// torch.remainder; integer division by zero fails when the step runs.
LOCKSTEP_BINARY_DECL(fmod)
LOCKSTEP_BINARY_DECL(remainder)
// floor(a / b), in the operands' dtype (integers stay integers), as torch.floor_divide.
LOCKSTEP_BINARY_DECL(floor_divide)
#undef LOCKSTEP_BINARY_DECL

// cond ? a : b, broadcasting all three; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, Loc loc = Loc::current());
Tensor where(const Tensor& cond, Scalar a, Scalar b, Loc loc = Loc::current());
// x where mask is false, `value` where it is true (mask broadcasts to x; bool).
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value, Loc loc = Loc::current());
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value,
                   Loc loc = Loc::current());
Tensor cast(const Tensor& x, DType dtype, Loc loc = Loc::current());
// min(max(x, lo), hi).
Tensor clamp(const Tensor& x, Scalar lo, Scalar hi, Loc loc = Loc::current());
// With tensor bounds (broadcast; an empty handle is no bound on that side), as torch.clamp.
Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi, Loc loc = Loc::current());
Tensor clamp_min(const Tensor& x, Scalar lo, Loc loc = Loc::current());
Tensor clamp_max(const Tensor& x, Scalar hi, Loc loc = Loc::current());

// ---- reductions: over `axes` (empty = all; negative counts from the end) -------------------
// sum of bool/i32 gives i64, as PyTorch does.
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           Loc loc = Loc::current());
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
            Loc loc = Loc::current());
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           Loc loc = Loc::current());
Tensor min(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           Loc loc = Loc::current());
// i64 index of the first extreme element within the reduced axes, counted row-major over them
// (for one axis: the index along it).
Tensor argmax(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
              Loc loc = Loc::current());
Tensor argmin(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
              Loc loc = Loc::current());
Tensor softmax(const Tensor& x, int64_t axis, Loc loc = Loc::current());
Tensor log_softmax(const Tensor& x, int64_t axis, Loc loc = Loc::current());
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false,
                 Loc loc = Loc::current());
// Variance and standard deviation with Bessel's `correction` (1: unbiased, PyTorch's default).
Tensor var(const Tensor& x, const std::vector<int64_t>& axes = {}, int64_t correction = 1,
           bool keepdim = false, Loc loc = Loc::current());
Tensor std(const Tensor& x, const std::vector<int64_t>& axes = {}, int64_t correction = 1,
           bool keepdim = false, Loc loc = Loc::current());
// Product of the elements (bool and i32 give i64, as sum does).
Tensor prod(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
            Loc loc = Loc::current());
// Vector p-norm over `axes` (all when empty): p = 2 (default), 1, any p > 0, inf (max |x|),
// -inf (min |x|), 0 (count of non-zeros), as torch.linalg.vector_norm.
Tensor norm(const Tensor& x, double p = 2, const std::vector<int64_t>& axes = {},
            bool keepdim = false, Loc loc = Loc::current());
// Whether any / all elements are non-zero (bool).
Tensor any(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           Loc loc = Loc::current());
Tensor all(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           Loc loc = Loc::current());
// Running sum / product along `axis` (bool and i32 give i64).
Tensor cumsum(const Tensor& x, int64_t axis, Loc loc = Loc::current());
Tensor cumprod(const Tensor& x, int64_t axis, Loc loc = Loc::current());

// ---- sorting -------------------------------------------------------------------------------
// Stable: equal values keep their order (PyTorch's stable=True); NaN sorts above every number.
struct ValuesIndices {
  Tensor values, indices;  // indices: i64 positions along the axis
};
ValuesIndices sort(const Tensor& x, int64_t axis = -1, bool descending = false,
                   Loc loc = Loc::current());
Tensor argsort(const Tensor& x, int64_t axis = -1, bool descending = false,
               Loc loc = Loc::current());
// The k largest (or smallest) along `axis`, in sorted order.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t axis = -1, bool largest = true,
                   Loc loc = Loc::current());

// ---- movement ------------------------------------------------------------------------------
// One dimension of `shape` may be -1 (inferred).
Tensor reshape(const Tensor& x, const Shape& shape, Loc loc = Loc::current());
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm, Loc loc = Loc::current());
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1, Loc loc = Loc::current());
// Size-1 dims stretch to the target; new leading dims may be added; -1 keeps a size.
Tensor expand(const Tensor& x, const Shape& shape, Loc loc = Loc::current());
Tensor unsqueeze(const Tensor& x, int64_t axis, Loc loc = Loc::current());
Tensor squeeze(const Tensor& x, int64_t axis, Loc loc = Loc::current());
Tensor flatten(const Tensor& x, int64_t start_axis = 0, int64_t end_axis = -1,
               Loc loc = Loc::current());
// Python slicing x[start:end:step] along one axis; start/end may be negative and are clamped.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1,
             Loc loc = Loc::current());
Tensor concat(const std::vector<Tensor>& xs, int64_t axis, Loc loc = Loc::current());
// Pieces along `axis`: `chunks` of ceil(size / chunks) (the last smaller, maybe fewer pieces),
// as torch.chunk; pieces of `size` (the last smaller) or of the given sizes, as torch.split.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis = 0,
                          Loc loc = Loc::current());
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t axis = 0,
                          Loc loc = Loc::current());
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis = 0,
                          Loc loc = Loc::current());
// Tensors of one shape joined along a new axis; the slices of x along an axis, that axis removed.
Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0, Loc loc = Loc::current());
std::vector<Tensor> unbind(const Tensor& x, int64_t axis = 0, Loc loc = Loc::current());
// x[index] along `axis`, that axis removed (index may be negative), as torch.select.
Tensor select(const Tensor& x, int64_t axis, int64_t index, Loc loc = Loc::current());
// PyTorch's basic indexing: integers (select, negative from the end), slices, None (a new axis)
// and at most one Ellipsis (the axes not named), left to right, as x[...] in PyTorch.
Tensor index(const Tensor& x, const std::vector<TensorIndex>& indices, Loc loc = Loc::current());
// x[start : start + length] along axis (start may be negative), as torch.narrow.
Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length,
              Loc loc = Loc::current());
Tensor movedim(const Tensor& x, int64_t source, int64_t destination, Loc loc = Loc::current());
Tensor movedim(const Tensor& x, const std::vector<int64_t>& source,
               const std::vector<int64_t>& destination, Loc loc = Loc::current());
// Tiles x repeats[i] times along axis i (leading axes added when repeats is longer).
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats, Loc loc = Loc::current());
// Reverses the order along each of `axes`.
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes, Loc loc = Loc::current());
// Shifts elements by shifts[i] along axes[i], wrapping around; with no axes, over the flattened
// tensor (shape kept), as torch.roll.
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts,
            const std::vector<int64_t>& axes = {}, Loc loc = Loc::current());
// Lower / upper triangle of the last two axes (diagonal 0 is the main one, > 0 above it);
// the rest zeroed.
Tensor tril(const Tensor& x, int64_t diagonal = 0, Loc loc = Loc::current());
Tensor triu(const Tensor& x, int64_t diagonal = 0, Loc loc = Loc::current());
// pads[i] = {before, after} for axis i (one pair per axis), filled with `value`.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, Scalar value = 0,
           Loc loc = Loc::current());

// ---- indexing ------------------------------------------------------------------------------
// out[i][j] = x[index[i][j]][j] for axis 0 (torch.gather); index is i64 with x's rank.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index, Loc loc = Loc::current());
// A copy of x with src[i][j] added at x[index[i][j]][j] for axis 0 (torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src,
                   Loc loc = Loc::current());

// The entries of x at the i64 1-d `index` along axis (torch.index_select).
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index, Loc loc = Loc::current());
// gather with x and index broadcast against each other outside `axis` (torch.take_along_dim).
Tensor take_along_dim(const Tensor& x, const Tensor& index, int64_t axis, Loc loc = Loc::current());
// i64 [..., num_classes]: 1 at each index (which must be in [0, num_classes)), as F.one_hot.
Tensor one_hot(const Tensor& index, int64_t num_classes, Loc loc = Loc::current());

// ---- linear algebra and convolution ---------------------------------------------------------
// Einstein summation over one or more operands ("bij,bjk->bik", "ij->ji", "...ij,...jk"),
// written as permutes, reshapes, sums and batched matmuls. An index repeated within one operand
// (a diagonal) is not supported.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands,
              Loc loc = Loc::current());
// [..., m, k] x [..., k, n] with broadcast batch dims; 1-d operands as numpy.matmul.
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};
// x [N, C, H, W], weight [O, C/groups, kh, kw] -> [N, O, Ho, Wo]. No bias: add it.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dOptions& options = {},
              Loc loc = Loc::current());
// Gradient of conv2d with respect to its input, given the output gradient.
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dOptions& options = {}, Loc loc = Loc::current());
// Gradient of conv2d with respect to its weight.
Tensor conv2d_backward_weight(const Tensor& x, const Tensor& grad_out, const Shape& weight_shape,
                              const Conv2dOptions& options = {}, Loc loc = Loc::current());

// One LSTM layer in one direction over a whole sequence, the op nn::LSTM records for f32 (one
// step of the program, oneDNN's LSTM on the cpu backend): x [T, N, I], h0 and c0 [N, H],
// weight_ih [4H, I], weight_hh [4H, H], bias [4H] (bias_ih + bias_hh), gates i, f, g, o as
// PyTorch's; `reverse` runs from the last time step to the first. Returns [T + 2, N, H]: the
// hidden state at each time step (in time order), then the last h and the last c. All f32 (or
// all f64: not on oneDNN).
Tensor lstm_layer(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& weight_ih,
                  const Tensor& weight_hh, const Tensor& bias, bool reverse = false,
                  Loc loc = Loc::current());
// Its gradient, given lstm_layer's result `out` and the gradient of that: the gradients of x,
// h0, c0, weight_ih, weight_hh and bias, flattened one after the other into one 1-d tensor.
Tensor lstm_layer_backward(const Tensor& x, const Tensor& h0, const Tensor& c0,
                           const Tensor& weight_ih, const Tensor& weight_hh, const Tensor& bias,
                           const Tensor& out, const Tensor& grad_out, bool reverse = false,
                           Loc loc = Loc::current());
// One GRU layer in one direction likewise (nn::GRU's op for f32): x [T, N, I], h0 [N, H],
// weight_ih [3H, I], weight_hh [3H, H], bias [4H] (bias_ih + bias_hh for the r and z gates, then
// bias_ih's and bias_hh's n parts), gates r, z, n as PyTorch's. Returns [T + 1, N, H]: the hidden
// state at each time step, then the last h.
Tensor gru_layer(const Tensor& x, const Tensor& h0, const Tensor& weight_ih,
                 const Tensor& weight_hh, const Tensor& bias, bool reverse = false,
                 Loc loc = Loc::current());
// Its gradient: those of x, h0, weight_ih, weight_hh and bias, flattened one after the other.
Tensor gru_layer_backward(const Tensor& x, const Tensor& h0, const Tensor& weight_ih,
                          const Tensor& weight_hh, const Tensor& bias, const Tensor& out,
                          const Tensor& grad_out, bool reverse = false, Loc loc = Loc::current());

struct ConvTranspose2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> output_padding{0, 0};  // below stride or dilation, as PyTorch's
  int64_t groups = 1;
  std::array<int64_t, 2> dilation{1, 1};
};
// torch.nn.functional.conv_transpose2d: x [N, C, H, W], weight [C, O/groups, kh, kw], bias [O]
// or undefined -> [N, O, (H-1)*stride - 2*padding + dilation*(kh-1) + output_padding + 1, ...].
// The adjoint of conv2d: recorded as conv2d_backward_input, so its gradients are a conv2d and a
// conv2d_backward_weight.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dOptions& options = {}, Loc loc = Loc::current());

struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};  // 0: same as kernel
  std::array<int64_t, 2> padding{0, 0};
  bool count_include_pad = true;  // avg_pool2d only, as PyTorch's default
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options, Loc loc = Loc::current());
// Values and i64 indices into each input plane's flattened H*W (as PyTorch).
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& options,
                                                  Loc loc = Loc::current());
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape,
                           const Pool2dOptions& options, Loc loc = Loc::current());
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options, Loc loc = Loc::current());
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape,
                           const Pool2dOptions& options, Loc loc = Loc::current());

// ---- operators -----------------------------------------------------------------------------
inline Tensor operator-(Located<Tensor> x) { return neg(x.value, x.loc); }
#define LOCKSTEP_OPERATOR(sym, fn)                                                                 \
  inline Tensor operator sym(Located<Tensor> a, const Tensor& b) { return fn(a.value, b, a.loc); } \
  inline Tensor operator sym(Located<Tensor> a, Scalar b) { return fn(a.value, b, a.loc); }        \
  inline Tensor operator sym(Scalar a, Located<Tensor> b) { return fn(a, b.value, b.loc); }
LOCKSTEP_OPERATOR(+, add)
LOCKSTEP_OPERATOR(-, sub)
LOCKSTEP_OPERATOR(*, mul)
LOCKSTEP_OPERATOR(/, div)
LOCKSTEP_OPERATOR(%, remainder)
LOCKSTEP_OPERATOR(==, eq)
LOCKSTEP_OPERATOR(!=, ne)
LOCKSTEP_OPERATOR(<, lt)
LOCKSTEP_OPERATOR(<=, le)
LOCKSTEP_OPERATOR(>, gt)
LOCKSTEP_OPERATOR(>=, ge)
LOCKSTEP_OPERATOR(&&, logical_and)
LOCKSTEP_OPERATOR(||, logical_or)
#undef LOCKSTEP_OPERATOR
inline Tensor operator!(Located<Tensor> x) { return logical_not(x.value, x.loc); }

// ---- indexing with tensors: PyTorch's x[...] in full ---------------------------------------
// One entry of an index expression: what TensorIndex holds (an integer, a Slice, None, Ellipsis),
// a bool (True adds an axis of size 1, False one of size 0, as PyTorch's), or a tensor: integer
// indices (i64 or i32, any shape, negative ones counting from the end; a 0-d one is an integer)
// or a bool mask (indexing as many axes as it has, which it must match).
class IndexItem {
 public:
  IndexItem(int64_t i) : v_(TensorIndex(i)) {}        // NOLINT: implicit, as TensorIndex's
  IndexItem(int i) : v_(TensorIndex(i)) {}            // NOLINT
  IndexItem(bool b) : v_(b) {}                        // NOLINT
  IndexItem(Slice s) : v_(TensorIndex(s)) {}          // NOLINT
  IndexItem(EllipsisIndex e) : v_(TensorIndex(e)) {}  // NOLINT
  IndexItem(NoneIndex n) : v_(TensorIndex(n)) {}      // NOLINT
  IndexItem(TensorIndex t) : v_(std::move(t)) {}      // NOLINT
  IndexItem(Tensor t) : v_(std::move(t)) {}           // NOLINT
  const std::variant<TensorIndex, bool, Tensor>& value() const { return v_; }

 private:
  std::variant<TensorIndex, bool, Tensor> v_;
};
// x[key] as PyTorch computes it: ls::index's basic indexing, plus advanced indices (integer
// tensors, masks, bools), which broadcast together; their result axes replace theirs when they
// are adjacent in the key, and come first otherwise. Integer tensors stay lazy (gathers): an index
// out of range fails when the step runs, as index_select's. A mask's result shape depends on its
// values: they are read (a blocking read and an implicit sync, as nonzero in PyTorch/XLA).
Tensor getitem(const Tensor& x, const std::vector<IndexItem>& key, Loc loc = Loc::current());
// A new tensor: x with x[key] replaced by `values` (converted to x's dtype, broadcast to x[key]'s
// shape after dropping its leading size-1 axes), or with `values` added there when `accumulate`
// (repeated indices add up), as torch.index_put; Python's x[key] = v is x.copy_(index_put(x, key,
// v)), since tensors are never views. Recorded as scatters and selects; the only read is a mask's
// (getitem's), and none for a mask whose values do not span its selected entries (a scalar or a
// tensor broadcast along them). Among repeated indices, the last one's value is written.
Tensor index_put(const Tensor& x, const std::vector<IndexItem>& key, const Tensor& values,
                 bool accumulate = false, Loc loc = Loc::current());
Tensor index_put(const Tensor& x, const std::vector<IndexItem>& key, Scalar value,
                 Loc loc = Loc::current());

}  // namespace lockstep
