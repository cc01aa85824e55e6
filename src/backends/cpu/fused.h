// Fused elementwise trees: a tree of elementwise ops (with broadcasts of their inputs) that is
// evaluated in one pass over cache-sized tiles, so intermediate values never touch memory.
// Values are f32 or bool (held as 0/1 floats inside a tile).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cpu/kernels.h"
#include "ir/ir.h"

namespace lockstep::backends::cpu {

// Whether node `id` can be part of a fused tree.
bool fusible(const ir::Graph& g, int32_t id);
// A Permute that keeps the last axis last (it moves rows and batches: attention's heads).
bool keeps_last_axis(const ir::GraphNode& n);
// A Permute that swaps the last two axes and nothing else (a transpose of matrices).
bool swaps_last_two(const ir::GraphNode& n);
// Whether node `id` is a permute that trees read as a leaf of its operand, through strides
// (FusionRules::view_leaf): one that keeps the last axis last (attention's heads, [T, B, C] and
// [B, T, C]), so that the tree reads runs along that axis, instead of a copy written and read
// back.
bool permute_leaf(const ir::Graph& g, int32_t id);

// Activation layouts. A 4-D value [N, C, H, W] whose C is a multiple of kBlock (kernels.h) and
// H * W > 1 may be held in oneDNN's blocked nChw16c layout, [N][C / 16][H][W][16 channels],
// between convolutions, so that they read and write it without reorders (see choose_layouts in
// cpu_backend.cpp). Elementwise trees, per-channel sums and max pooling walk such values in that
// order.
bool blockable(const Shape& s);

// Whether `op` on bf16 (or bool) operands yields bf16 values as they are: no rounding needed.
bool exact_in_bf16(ir::Op op, DType in);

// A call of a tree's native code (native.cpp): values [0, len) of the result into `out`, from
// the registers as eval() loads the leaves into them (`reg`, by number; a one-value register's
// tile holds its value first); `side`: the part to compute, 0 for a plain tree, for a root `where`
// of one condition 0 its true side and 1 its false, for a staged tree the stage, whose values that
// later stages read (native_exports) it also stores where `reg` points for them; `math`:
// vector_math_fn of each MathFn for the ISA the code was built for.
struct NativeCall {
  int64_t len;
  const float* const* reg;
  float* out;
  int side;
  void* const* math;
};
using NativeFn = void (*)(const NativeCall*);

// Instr::scalars bits: operand a or b is a scalar register (one value for the whole tree).
enum : unsigned { kScalarA = 1, kScalarB = 2 };

class FusedTree {
 public:
  // The tree rooted at `root`; operands with absorbed[id] are evaluated inside the tree, the
  // others are read from memory. Leaves with blocked[id] are held in the blocked layout; with
  // blocked_order the tree computes its values in that layout's order (its root shape must be
  // blockable), else in plain order.
  FusedTree(const ir::Graph& g, int32_t root, const std::vector<bool>& absorbed,
            const std::vector<bool>* blocked = nullptr, bool blocked_order = false);
  // Trees over the same rows of `row` values laid end to end (plain order), as one program of
  // stages: stage k computes roots[k]'s tree (computed[k]; else reads roots[k] from memory),
  // reusing any value an earlier stage computed rather than computing it again (a softmax's
  // exp(x - max) for its sum and for its quotient). See run_rows().
  FusedTree(const ir::Graph& g, const std::vector<int32_t>& roots,
            const std::vector<bool>& computed, const std::vector<bool>& absorbed, int64_t row);
  // Nodes whose values the tree reads from memory, in the order run() takes their pointers.
  const std::vector<int32_t>& leaf_nodes() const { return leaf_nodes_; }
  // The leaf pointers eval() and run_group() take, from each node's memory (`ptr`, by node).
  // A leaf broadcast per channel over short runs (a small feature map) is read from one period
  // of its values written out in full, and a per-channel leaf in blocked order from a tile's
  // worth of each block's channels; both into buffers taken from `expanded`, which must outlive
  // the pointers.
  std::vector<const void*> bind(const std::vector<void*>& ptr, RunBuffers& expanded) const;
  // Trees of the same numel (one or more), tile by tile: for each tile, each tree in order (a
  // tree may read an earlier one's output, element for element); outs[k] may be one of tree k's
  // leaves (an update in place).
  static void run_group(const std::vector<const FusedTree*>& trees,
                        const std::vector<std::vector<const void*>>& leaves,
                        const std::vector<void*>& outs);
  // One step of a staged run (run_rows), in order: `stage` of the staged tree, its values then
  // stored into `out` (sink Op::Data; f32, bf16 or bool as its root) or reduced row by row into
  // `out` (Max, Min or Sum, f32; a row's NaN gives NaN for max and min); or a tree over one value
  // per row (`per_row`, its leaves bound: a layer norm's mean from its sum) for the tile's rows.
  struct RowStep {
    int stage = -1;
    ir::Op sink = ir::Op::Data;
    const FusedTree* per_row = nullptr;
    std::vector<const void*> leaves;
    void* out = nullptr;
  };
  // A staged tree (the constructor above), tile by tile, each tile whole rows: per tile each
  // step in turn, so that a later stage reads the row values an earlier step wrote (broadcast
  // along its rows) or its stored values (element for element) from memory.
  static void run_rows(const FusedTree& tree, const std::vector<const void*>& leaves,
                       const std::vector<RowStep>& steps);
  // Whether leaf k is read from a copy bind() makes (a period or a per-block table): one made
  // before the run, so not a value the run itself writes.
  bool leaf_is_expanded(size_t k) const { return leaves_[k].period > 0 || leaves_[k].per_block; }
  // Whether leaf k is read through a permute of its dims (in plain layout, whatever the tree's).
  bool leaf_is_permuted(size_t k) const { return leaves_[k].permuted; }
  // Whether leaf k is read element for element (same numel, no broadcast).
  bool leaf_is_elementwise(size_t k) const {
    return leaves_[k].contiguous && leaves_[k].numel == numel_;
  }
  // Values [i0, i0 + len) (len <= kTile; a staged tree's run: kRowTile) of the tree's result, as
  // floats (bool as 0/1); scratch holds scratch_floats(). Computed into dst when given (and returns
  // it), else into scratch; a result that is an operand's values as they are (a leaf the tree reads
  // whole, or the side a one-value `where` picks) is returned where it lies, for the caller to
  // copy. With scalars_loaded, the scalar leaves' registers already hold their values (scratch kept
  // from an earlier eval of this tree).
  const float* eval(const std::vector<const void*>& leaves, int64_t i0, int64_t len, float* scratch,
                    float* dst, bool scalars_loaded = false) const;
  // (Native code loads every leaf before it computes: the leaves not kept get tiles of their own
  // past the instructions', so do a staged tree's exports that have none, then its result one.)
  size_t scratch_floats() const { return static_cast<size_t>(native_out_ + 1) * tile_; }
  // The instructions as C++ (native.cpp): an extern "C" NativeFn named `name` over vectors of
  // the module's width (its prelude's W) that computes what eval() computes, bit for bit, after the
  // leaves are loaded; empty when the tree has an op native code does not compute (pow, fmod), is a
  // leaf as it is, or is longer than native code takes.
  std::string native_source(const std::string& name) const;
  // Gives the tree its native code (loaded from a compile of native_source): eval() runs it
  // from then on, instead of the instructions one by one. Any thread, while others evaluate.
  void set_native(NativeFn fn) const { native_.store(fn, std::memory_order_release); }
  bool has_native() const { return native_.load(std::memory_order_acquire) != nullptr; }
  // Asks for the cache lines of values [i0, i0 + len) of the leaves read in place (from memory,
  // element for element), before eval() reads them: an eval reads its leaves one instruction at
  // a time, and each stream's misses would otherwise wait for the last one's.
  void prefetch(const std::vector<const void*>& leaves, int64_t i0, int64_t len) const;
  int64_t numel() const { return numel_; }
  // The instructions, as "sub(r0,r1)->r2 add(r2*r3,r4)+relu->r5" (for plan dumps; r2*r3: a
  // multiply folded into the sum, +relu: a relu applied by it).
  std::string describe() const;

  // Broadcast runs this short or shorter are read from an expanded period (see bind()), of at most
  // kMaxPeriod floats and repeated at least twice over the tree.
  static constexpr int64_t kShortRun = 64;
  static constexpr int64_t kMaxPeriod = 262144;
  // A staged tree's tiles: whole rows of up to this many values. Longer than kTile, since a row
  // program runs many short instructions per row (reductions, their broadcasts): a layer norm
  // over [1024, 256] took 0.168 ms on one thread with 2,048, 0.178 with 1,024 and 0.197 with
  // 512 (AMD Zen 4); 4,096 was slower again.
  static constexpr int64_t kRowTile = 2048;

 private:
  struct Leaf {
    DType dtype;
    bool contiguous;        // same shape as the tree: element i is at i
    bool permuted = false;  // read through a permute of its dims (an absorbed Permute)
    int64_t numel;
    // Otherwise: the source offset of output index i is sum_d ((i / div[d]) % mod[d]) * stride[d].
    std::vector<int64_t> div, mod, stride;
    // > 0: read through bind()'s copy of one period (div * mod of the outermost dim) instead of
    // run by run: one broadcast dim with runs of at most kShortRun, or a per-channel value in
    // blocked order whose blocks' runs are shorter than a tile (small maps).
    int64_t period = 0;
    // The floats of bind()'s copy: the period repeated to fill a tile (a whole number of
    // periods), so that a tile starting at a multiple of the period reads the copy in place.
    int64_t expanded = 0;
    // In blocked order, a per-channel value: each 16 values are the 16 channels of one block
    // (div[0] = 1, mod[0] = 16), the same block for div[1] values in a row. Read through
    // bind()'s table of a tile's worth of each block's values repeated.
    bool per_block = false;
  };
  struct Instr {
    ir::Op op;
    int out, a = -1, b = -1, c = -1;  // registers
    unsigned scalars = 0;             // kScalarA/B: that operand is one value (scalar_reg_)
    DType in_dtype;                   // operand 0's dtype
    DType out_dtype;
    // An Add or Sub with the multiplies that fed it folded in: a * sa +- b * sb (registers, one
    // value when scalar_reg_; -1: not scaled).
    int sa = -1, sb = -1;
    bool relu = false;  // an Add or Sub that also applies the relu that read it
    int slot = -1;      // the scratch tile it writes (assign_slots), when it writes one
    bool kept = false;  // a scalar leaf whose tile stays filled from tile to tile
    // A leaf's scratch tile under native code, which loads every leaf before it computes: a
    // kept leaf's own, else one past the instructions' tiles for each leaf (assign_slots).
    int native_slot = -1;
    int stage = 0;  // the stage (root) whose tree it belongs to (staged trees)
  };
  int visit(const ir::Graph& g, int32_t root, const std::vector<bool>& absorbed);
  // A staged tree's registers that `stage` computes and a later stage reads: native code stores
  // them (into their instructions' scratch tiles), where the interpreter keeps every value.
  std::vector<int> native_exports(size_t stage) const;
  // Per stage: whether native code computes it (it has instructions), and its exports with the
  // scratch tile each is stored in.
  std::vector<char> stage_coded_;
  std::vector<std::vector<std::pair<int, int>>> stage_exports_;
  // A leaf's values [i0, i0 + len) for instruction `in` (an Op::Data): where they lie (an f32
  // leaf read element for element, a period or table bind() wrote), else loaded into `own`.
  const float* load_data(const Instr& in, const std::vector<const void*>& leaves, int64_t i0,
                         int64_t len, float* own, bool scalars_loaded) const;
  // Part `part` of the native code (NativeCall::side) over values [i0, i0 + len): the leaves of
  // instructions [begin, end) loaded (those `needs` marks, when given), then the code run, into
  // `dst` when given (returned), else into scratch.
  const float* run_native(NativeFn fn, int part, const std::vector<const void*>& leaves,
                          size_t begin, size_t end, const char* needs, const float** reg,
                          int64_t i0, int64_t len, float* scratch, float* dst,
                          bool scalars_loaded) const;
  // Instructions [begin, end) over values [i0, i0 + len) into registers `reg` (see eval());
  // returns register `result`'s values. `needs`: the instructions to run (null: all).
  const float* run(const std::vector<const void*>& leaves, size_t begin, size_t end, int result,
                   const char* needs, const float** reg, int64_t i0, int64_t len, float* scratch,
                   float* dst, bool scalars_loaded) const;
  // Folds each multiply that only an Add or Sub reads (of a tile by one value or by another
  // tile) into that Add or Sub (Instr::sa, sb), and a Relu of such a sum into the sum
  // (Instr::relu): one pass over the tile instead of two to four.
  void fold_scaled_sums();
  // Scratch tiles for the instructions' values, each reused once the last reader of the value
  // in it (or of a value passed on from it) has run: a tree needs as many tiles as values live
  // at once, not one per instruction (a chain of 100,000 adds took 400 MB of scratch per
  // thread). The first kKeptScalars scalar leaves keep theirs for the whole run.
  void assign_slots();
  // A leaf: node's values read in the order of out_shape, broadcast (node's shape aligned to the
  // right of out_shape) or, with perm, through a permute of node's dims (out dim d is node's
  // dim perm[d]; same rank).
  int add_leaf(const ir::Graph& g, int32_t node, const Shape& out_shape,
               const std::vector<int64_t>* perm = nullptr);
  // Values [i0, i0 + len) of a leaf as floats: load() reads a periodic leaf from the period
  // bind() expanded, load_source() from the leaf's own memory.
  void load(const Leaf& leaf, const void* src, int64_t i0, int64_t len, float* dst) const;
  void load_source(const Leaf& leaf, const void* src, int64_t i0, int64_t len, float* dst) const;

  int64_t numel_ = 0;
  int64_t tile_ = kTile;  // the longest run of values an instruction covers (scratch tiles)
  bool blocked_order_ = false;
  const std::vector<bool>* blocked_ = nullptr;  // while constructing
  DType out_dtype_ = DType::F32;
  int num_regs_ = 0;
  int num_slots_ = 0;     // scratch tiles (assign_slots)
  int native_loads_ = 0;  // leaves whose tiles are not kept (Instr::kept)
  int native_out_ = 0;    // the tile native code computes a result into (after all others)
  int root_reg_ = -1;
  // Staged trees: per stage, its root's register, its result's dtype and the end of its
  // instructions; the row length.
  std::vector<int> stage_root_;
  std::vector<DType> stage_dtype_;
  std::vector<size_t> stage_end_;
  int64_t row_ = 0;
  std::vector<Leaf> leaves_;
  std::vector<int32_t> leaf_nodes_;
  std::vector<Instr> instrs_;
  // Per register: it holds one value broadcast over the tree (a single-element leaf of a larger
  // tree), so instructions read it once instead of tile by tile.
  std::vector<char> scalar_reg_;
  // When the root is a `where` whose condition is one value (an optimizer's "first step" or
  // "finite" flag): the leaf holding the condition, and per side (true, false) which
  // instructions that side needs. eval() reads the condition first and runs only those.
  int pick_cond_leaf_ = -1;
  std::vector<char> pick_needs_[2];
  std::unordered_map<int32_t, int> reg_of_;
  mutable std::atomic<NativeFn> native_{nullptr};
};

}  // namespace lockstep::backends::cpu
