// Data parallel training over several processes (OpenMPI): one replica per process, each on its
// own shard of the data, gradients averaged every step. The same program runs with one process
// (world size 1: collectives are the identity) or under `mpirun -np N`.
//
//   ls::dist::init();                       // reads mpirun's environment
//   ls::dist::DataParallel dp(model);       // rank 0's parameters and buffers on every rank
//   ls::step([&] {
//     loss = ...; loss.backward();
//     dp.average_gradients();               // lazy all-reduces, bucketed and overlapped
//     opt.step();
//   });
//
// Collectives are lazy ops in the step's program, like any other op: the program's all-reduces
// start as soon as their gradients are computed and are waited for only where the optimizer
// first reads them. Replicas must run the same programs: before each program with collectives
// runs, the ranks compare their graphs' hashes, and a mismatch is an Error on every rank naming
// the ranks, their hashes and the first node that differs. No collective waits forever: each has
// a deadline (timeout(), LOCKSTEP_DIST_TIMEOUT in seconds); a rank that misses it makes the
// others raise Error naming it, and the world is then broken: every later collective raises at
// once, and the process should exit non-zero (mpirun then ends the job).
//
// BatchNorm running statistics stay per replica (as in torch_xla): each rank's are computed on
// its own shard; DataParallel broadcasts rank 0's only at construction.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/io.h"
#include "lockstep/optim.h"
#include "lockstep/tensor.h"

namespace lockstep::nn {
class Module;
}

namespace lockstep::dist {

// Joins the job mpirun (or another MPI launcher) started; idempotent. Not under a launcher:
// world size 1, MPI is not touched. Uses MPI as the program set it up if it already called
// MPI_Init (then finalize() leaves it to the program). Throws BackendError if MPI fails.
void init();
bool initialized();
// Whether this process was started by mpirun or another MPI launcher (its environment says so).
bool under_launcher();
int rank();        // 0 before init()
int world_size();  // 1 before init() and when not under a launcher
int local_rank();  // among the ranks on this host
int local_size();
// Waits until every rank has called it (deadline: timeout()).
void barrier();
// The largest of every rank's `value`, on every rank: a host-side agreement (a decision made from
// something only some ranks saw, such as a signal, so that all act on it at the same step). Every
// rank must call it at the same point (deadline: timeout()); a rank elsewhere (at a barrier, a
// program with collectives or a value check) is an Error naming the ranks and `what`. World size
// 1: `value`.
int64_t max_on_all_ranks(int64_t value, const std::string& what);
// Waits for this process's programs, then ends MPI (once; also at exit). Never hangs: when the
// world is broken or a peer does not arrive within the deadline, MPI is left unfinalized and
// mpirun ends the job.
void finalize();

// The deadline of every collective and check (default 30 s; LOCKSTEP_DIST_TIMEOUT, seconds).
std::chrono::milliseconds timeout();
void set_timeout(std::chrono::milliseconds t);

// Whether an earlier collective failed (a peer missed a deadline): nothing more can be exchanged.
bool broken();

// Sum over the ranks, times `scale` (scale 1/world_size(): the mean). Lazy: recorded in the
// step's program; every rank must record it at the same point of the same program. Its gradient
// is the all-reduce of the gradient with the same scale.
Tensor all_reduce(const Tensor& x, double scale = 1.0, Loc loc = Loc::current());
// Rank `root`'s value on every rank. Lazy, as all_reduce; no gradient.
Tensor broadcast(const Tensor& x, int root = 0, Loc loc = Loc::current());
// The same, ordered after `after` on every rank: the program computes them before it, whatever
// each rank computes `x` from. Collectives must run in one order on every rank; a value only the
// root computes (its shard of an update) would otherwise put its broadcast earlier on the ranks
// that only receive it (ZeroRedundancyOptimizer orders its broadcasts so).
Tensor broadcast(const Tensor& x, int root, const std::vector<Tensor>& after,
                 Loc loc = Loc::current());

// A hash of the values (bytes) of `tensors`, the same on every rank that holds the same values.
uint64_t hash_values(const std::vector<Tensor>& tensors, Loc loc = Loc::current());
// Throws Error naming the ranks whose `tensors` differ from rank 0's (e.g. after loading a
// checkpoint on every rank); `what` names them in the message.
void check_same_on_all_ranks(const std::vector<Tensor>& tensors, const std::string& what,
                             Loc loc = Loc::current());

struct DataParallelOptions {
  // Gradients are all-reduced in buckets of about this many bytes, in the order backward
  // produces them (the reverse of the parameters'): PyTorch DDP's defaults.
  int64_t bucket_bytes = int64_t{25} << 20;
  int64_t first_bucket_bytes = int64_t{1} << 20;
  // Each step, every rank takes rank 0's buffers (batch norm's running statistics), as PyTorch
  // DDP's broadcast_buffers: the replicas stay whole copies, buffers included. Off: each keeps
  // the statistics of its own batches, and check_replicas_agree compares parameters only.
  bool broadcast_buffers = true;
};

// Data parallel training of `model`: at construction, every rank takes rank 0's parameters and
// buffers; average_gradients() replaces each parameter's gradient by its mean over the ranks.
class DataParallel {
 public:
  explicit DataParallel(nn::Module& model, DataParallelOptions options = {},
                        Loc loc = Loc::current());
  // Call after backward and before the optimizer's step, inside the step (it also takes rank
  // 0's buffers, with broadcast_buffers).
  void average_gradients(Loc loc = Loc::current());
  // hash_values of the parameters and buffers (replicas stay bit-identical: compare these).
  uint64_t state_hash(Loc loc = Loc::current()) const;
  // check_same_on_all_ranks over the parameters, then the buffers (unless broadcast_buffers is
  // off): the Error says which of them differ and what makes replicas part.
  void check_replicas_agree(Loc loc = Loc::current()) const;

 private:
  nn::Module* model_;
  DataParallelOptions options_;
};

// ZeRO stages 1 and 2 under PyTorch's name (torch.distributed.optim.ZeroRedundancyOptimizer): the
// optimizer's state is sharded over the ranks. Each parameter has one owner rank, chosen as
// PyTorch does (largest first, each to the rank holding the fewest elements so far); a rank keeps
// the state of its own parameters only and updates only them, with the optimizer `make_local`
// builds over them (any ls::optim optimizer), then every parameter takes its owner's value by a
// broadcast in the step's program. A parameter larger than an even share of all the elements
// (numel > total / N; an embedding, say), which no one rank could hold and stay even, is split
// instead (DeepSpeed's flat partition): the split parameters, end to end in row-major order, are
// cut into one run per rank so that every rank holds the same number of elements to one (counting
// the whole parameters it owns; any count, divisible by N or not). Each rank updates its runs and
// keeps their state, and the runs are broadcast from their ranks and joined. owner(i) is -1 for
// such a parameter (run(i) is this rank's). The optimizers are elementwise, so a split parameter
// trains as a whole one. AdamW in f32 keeps 8 bytes of state per parameter; each rank keeps about
// 8/N of them.
//
// Stage 1: gradients stay whole on every rank (DataParallel's average_gradients, as before), so
// the updates and the skip of non-finite steps are those of the unsharded optimizer: the replicas
// train exactly as with DataParallel alone. ZeroOptions::max_grad_norm clips as under stage 2 (each
// rank scales the gradients it owns), or clip_grad_norm_ over the model's gradients before step().
// Stage 2: the gradients are sharded too. step() reduces each gradient to its owner alone (in
// buckets, in the order backward makes them, overlapped with it as DataParallel's all-reduces;
// DataParallel's all-reduces recorded in the same step are replaced, not run), and the other ranks
// drop theirs: after the step a rank holds the gradients of the parameters it owns. Clip with
// ZeroOptions::max_grad_norm (the global norm, from each rank's share), not clip_grad_norm_ over
// the model's gradients (which a rank no longer holds whole); skip_nonfinite skips on every rank
// when any rank's share is not finite.
//
//   ls::dist::DataParallel dp(model);
//   ls::dist::ZeroRedundancyOptimizer opt(model.parameters(), [](std::vector<ls::Tensor> mine) {
//     return std::make_unique<ls::optim::AdamW>(std::move(mine), ls::optim::AdamOptions{.lr =
//     1e-3});
//   }, {.stage = 2, .max_grad_norm = 1.0});
//   ls::step([&] { ...; loss.backward(); dp.average_gradients(); opt.step(); });
//
// It is an ls::optim::Optimizer: schedulers, parameter groups (learning rate and weight decay per
// group, handed to the local optimizer at each update) and checkpoints work on it. Its state_dict
// holds this rank's shard (the step counts and the local optimizer's buffers, named by the
// parameters' indices in params()): each rank saves and loads its own, at the same world size
// (save_sharded and load_sharded below: at any).
// A rank may own nothing (fewer parameters than ranks, none larger than an even share): it keeps
// no state (its local optimizer holds only the hyper-parameters) and takes part in every
// collective.
struct ZeroOptions {
  // 1: the optimizer's state sharded; 2: the gradients as well; 3: the parameters too (set by
  // fully_shard, which shards them)
  int stage = 1;
  // > 0: step() first scales the gradients so that their global L2 norm is at most this (as
  // clip_grad_norm_ over all of them); last_grad_norm() is the norm before.
  double max_grad_norm = 0;
  bool skip_nonfinite = false;  // as the optimizers' own option (the local one's is not used)
  // Stage 3 (fully_shard): the backward gathers each parameter again rather than keep the
  // forward's gather (FSDP2's option and default); false keeps it, one gather a step less per
  // parameter for the memory of every gathered parameter from its forward to its backward.
  bool reshard_after_forward = true;
  // Stages 2 and 3: the gradients reduced to their owners go in buckets of about this many bytes
  // (the first of at most DataParallelOptions' first_bucket_bytes), at most two in flight while
  // the backward fills the next, so that the step holds about three buckets of the other ranks'
  // gradients at once rather than all of them (larger: fewer, longer reduces).
  int64_t bucket_bytes = int64_t{4} << 20;
};

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  using LocalFactory = std::function<std::shared_ptr<optim::Optimizer>(std::vector<Tensor> params)>;
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const LocalFactory& make_local,
                          ZeroOptions options = {}, Loc loc = Loc::current());
  // The rank that updates params()[i] and keeps its state; -1 when it is split over the ranks
  // (run).
  int owner(size_t i) const { return owners_[i]; }
  // This rank's run of a split parameter's elements (row-major): it updates and keeps the state
  // of [offset, offset + numel). numel 0: params()[i] is not split, or this rank has none of it.
  struct Run {
    int64_t offset = 0, numel = 0;
  };
  Run run(size_t i) const;
  int stage() const { return stage_; }
  // The optimizer over this rank's parameters; a split parameter's run is a tensor of its own,
  // which holds no value between steps (its reads see zeros).
  optim::Optimizer& local() { return *local_; }
  // Elements of gradient this rank keeps after a step (stage 2 and 3: its parameters' and its
  // runs'; stage 1: every gradient, whole).
  int64_t local_grad_numel() const;
  void zero_grad() override;
  // Elements of optimizer state this rank keeps (its local optimizer's buffers).
  int64_t local_state_numel() const;
  // The gradients' global L2 norm before the last step's clipping (a 0-d tensor; undefined
  // without max_grad_norm or before the first step).
  const Tensor& last_grad_norm() const { return grad_norm_; }
  double momentum() const override;
  void set_momentum(double momentum) override;

 protected:
  void update(size_t i, const Tensor& grad, const Tensor& t, const Tensor& ok) override;
  nn::NamedTensors state() const override;
  void add_state(size_t i) override;
  std::vector<Tensor> step_gradients() override;
  Tensor count_nonfinite(const std::vector<Tensor>& grads, const Tensor& loss) override;
  void end_step() override;

 private:
  struct Shard;
  static Shard partition(std::vector<Tensor> params, const LocalFactory& make_local,
                         const ZeroOptions& options, const Loc& loc, bool of_fully_shard = false);
  // Stage 3, for fully_shard.
  static std::shared_ptr<ZeroRedundancyOptimizer> sharding(std::vector<Tensor> params,
                                                           const LocalFactory& make_local,
                                                           ZeroOptions options, const Loc& loc);
  friend std::shared_ptr<ZeroRedundancyOptimizer> fully_shard(nn::Module&, const LocalFactory&,
                                                              ZeroOptions, Loc);
  ZeroRedundancyOptimizer(Shard shard, ZeroOptions options);
  std::vector<Tensor> reduce_to_owners();
  // This step's values every rank computed by a collective before the updates (the gradients'
  // all-reduces or reduces, the last parameter's first, then the norm and the non-finite
  // count): what the broadcasts after the updates, or stage 3's fence, are ordered after.
  std::vector<Tensor> step_collectives() const;
  // `share` (this rank's part of the norm or of the non-finite count, to be summed over the
  // ranks), ordered after the gradients' reduces when some rank owns no parameter: that rank's
  // share reads none of them, and its all-reduce could otherwise start before them while the
  // others start their reduces (a broadcast of a zero ordered after them, added to the share).
  Tensor after_reduces(const Tensor& share) const;
  void clip(std::vector<Tensor>& grads);
  // Broadcasts each rank's run of split parameter i from it, ordered after `after`, and joins them
  // into its value.
  void join_runs(size_t i, std::vector<Tensor> after);

  std::shared_ptr<optim::Optimizer> local_;
  std::vector<int> owners_;             // per parameter (-1: split)
  std::vector<std::vector<Run>> runs_;  // per split parameter, each rank's run
  std::vector<int64_t> local_of_;       // per parameter: its index in local_, or -1
  std::vector<size_t> global_of_;       // per parameter of local_: its index in params()
  std::vector<int64_t> load_;           // elements owned per rank (for added groups)
  int stage_ = 1;
  bool reshard_after_forward_ = true;  // stage 3's (for parameters added later)
  double max_grad_norm_ = 0;
  int64_t bucket_bytes_ = 0;
  Tensor grad_norm_;
  // This step's: the gradients as averaged, before clipping (under stage 2 the reduces, which
  // every rank holds), and the values every rank computed by a collective before the updates (the
  // norm, the non-finite count): the broadcasts are ordered after them. Dropped after the step:
  // held, they would keep every gradient's buffer alive between steps.
  std::vector<Tensor> reduced_;
  std::vector<std::vector<Tensor>> run_reduces_;  // stage 2: each split gradient's, per rank
  std::vector<Tensor> globals_;
  size_t last_ = 0;  // the parameter broadcast last (the next is ordered after it)
  Tensor fence_;     // stage 3: the last step's broadcast after its reduces (see end_step)
};

// ZeRO-3 under FSDP2's name (torch.distributed.fsdp.fully_shard): the parameters are sharded
// too. Each parameter lives on its owner rank alone (ZeroRedundancyOptimizer's partition); the
// others hold a stand-in that takes no memory. A parameter larger than an even share is split as
// under stages 1 and 2: each rank holds its run (run(i)), a tensor of its own that it updates, and
// the parameter is a stand-in on every rank. Every op that reads a parameter reads a broadcast
// from its owner (of a split one, each run's from its rank, joined), recorded once per step, in
// the step's program like the other collectives: the gathered value lives while the forward reads
// it, and the backward reads a second gather made just before it needs it (the compiler's pass, so
// the memory plan sees both), not the whole model from forward to backward. Gradients are reduced
// to their owners as under stage 2, and each owner updates its own parameters. Returns the
// optimizer (stage 3; ZeroOptions's other fields as for ZeroRedundancyOptimizer):
//
//   auto opt = ls::dist::fully_shard(model, [](std::vector<ls::Tensor> mine) {
//     return std::make_shared<ls::optim::AdamW>(std::move(mine), ls::optim::AdamOptions{});
//   });
//   ls::step([&] { opt->zero_grad(); loss = ...; loss.backward(); opt->step(); });
//
// Every rank starts from rank 0's parameters and buffers (as DataParallel). Call between steps,
// once per model, after any DataParallel over it. Reading a parameter (item, a checkpoint, an
// op outside a step) gathers it: a collective that every rank must make, in the same order.
std::shared_ptr<ZeroRedundancyOptimizer> fully_shard(
    nn::Module& model, const ZeroRedundancyOptimizer::LocalFactory& make_local,
    ZeroOptions options = {}, Loc loc = Loc::current());

// Sharded checkpoints: each rank writes its own part of the training state to
// `dir`/shard-<rank>-of-<N>-g<generation>.safetensors (checksummed, written atomically): the
// optimizer's buffers of the parameters it owns (ZeroRedundancyOptimizer::owner; of a split one,
// its run's, named "<name>#<offset>"; with another optimizer, the same partition of its
// parameters), its share of the model's tensors (the same partition of the state dict; under
// fully_shard the parameters it holds, and its runs of the split ones, named so too, which the
// file's metadata lists with the whole's shape: "run.<entry>"), and rank 0 the rest (step counts,
// the scheduler's state, the generator's). No rank gathers the state. Then rank 0 writes
// `dir`/index.safetensors (world size, generation, files, `metadata`), the commit: a save killed
// before it leaves the previous checkpoint whole, and the previous generation's files are removed
// after it. Call between steps, on every rank.
void save_sharded(const std::string& dir, const nn::Module& model,
                  const optim::Optimizer* optimizer = nullptr,
                  const optim::Scheduler* scheduler = nullptr, const io::Metadata& metadata = {},
                  Loc loc = Loc::current());
// The same, asynchronous: returns once this rank's part is copied (host memory the size of its
// share), while a thread of its own writes the file and, once every rank's is on disk, rank 0
// commits the index, as save_sharded does; training goes on meanwhile. A rank killed before the
// commit leaves the previous checkpoint whole. The next save (of either kind), load_sharded,
// export_safetensors, wait_for_save, finalize and the process's exit wait for it. Call between
// steps, on every rank; an error of the writer is thrown by the next of those to wait.
void save_sharded_async(const std::string& dir, const nn::Module& model,
                        const optim::Optimizer* optimizer = nullptr,
                        const optim::Scheduler* scheduler = nullptr,
                        const io::Metadata& metadata = {}, Loc loc = Loc::current());
// Waits for this process's asynchronous save in flight, if any; throws what its writer threw.
void wait_for_save();
// Loads a sharded checkpoint at any world size: each rank reads, from whichever files hold them,
// the model's tensors and the optimizer state it keeps now (all of it for an unsharded optimizer;
// its owned parameters' and its runs' for ZeroRedundancyOptimizer, however the saving run
// partitioned or split them: runs are read where they overlap and joined or cut).
// A split parameter's runs are joined into the whole (under fully_shard, this rank then keeps
// its run of it). Everything is checked first (a missing, truncated or corrupt file, a tensor of
// another shape, runs that do not join up, a tensor no file holds: an Error naming the file or the
// tensor) and nothing changes then.
// Returns the metadata saved with it.
io::Metadata load_sharded(const std::string& dir, nn::Module& model,
                          optim::Optimizer* optimizer = nullptr,
                          optim::Scheduler* scheduler = nullptr, Loc loc = Loc::current());

// Writes the model's tensors of the sharded checkpoint in `dir` to one ordinary safetensors file
// at `path`, named as the model's state_dict names them (PyTorch's: safetensors.torch.load_file
// then load_state_dict(strict=True) takes it), with the checkpoint's metadata and "format": "pt".
// Streamed: each tensor is read from its shard's file (its checksum checked; a split parameter's
// runs from theirs, joined) when the file needs it, so one tensor at a time is in memory,
// whatever the model's size. No collective: call it on
// one process (a rank, or a program of its own), before or after training. Returns the metadata.
io::Metadata export_safetensors(const std::string& dir, const std::string& path,
                                Loc loc = Loc::current());

}  // namespace lockstep::dist
