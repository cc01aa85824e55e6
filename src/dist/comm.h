// The MPI world behind ls::dist, for the rest of lockstep (no MPI types here): the collectives
// the backends' kernels run, and the check that every rank is about to run the same program.
//
// Two communicators: the runtime thread's (the collectives inside programs, in program order)
// and the recording threads' (the checks, barrier, hashes): each is used in one order on every
// rank. Every wait polls until a deadline (dist::timeout()); a missed deadline breaks the world
// (requests stay in flight, so their buffers are kept until exit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ir/ir.h"
#include "lockstep/dtype.h"

namespace lockstep::dist::detail {

// World size > 1: collectives exchange data (otherwise they are the identity).
bool active();

// A non-blocking sum over the ranks, in place, on the runtime thread's communicator.
struct InFlight;
// Starts summing `count` elements of `dtype` at `data` (kept alive by `keep` until done).
// `what` names it in errors ("all_reduce of 3 gradients (1.20 MiB) at train.cpp:40").
// root >= 0: a reduce, the sum written on rank `root` alone (the others' `data` is unchanged).
std::shared_ptr<InFlight> start_all_reduce(void* data, int64_t count, DType dtype,
                                           std::shared_ptr<void> keep, std::string what,
                                           int root = -1);
// Starts sending rank `root`'s value to every rank's `data`: the root's is first copied there
// from `from` (unless that is `data`); the other ranks' `from` is not read (a sharded parameter's
// stand-in there). `bytes` each. `prefetched`: a gather started ahead of its use
// (prefetch_gathers), which starts the progress thread under LOCKSTEP_DIST_PROGRESS_US's default.
std::shared_ptr<InFlight> start_broadcast(void* data, const void* from, size_t bytes, int root,
                                          std::shared_ptr<void> keep, std::string what,
                                          bool prefetched = false);
// Waits for it: Error naming `what` and the program when the deadline passes or MPI fails.
void wait(InFlight& op);
// Lets MPI move every collective in flight along (OpenMPI progresses only inside MPI calls).
void progress();
// Whether any collective is in flight (the executable then calls progress between its steps).
bool in_flight();

// Blocking forms (collectives outside buckets, and the ref backend's).
void all_reduce(void* data, int64_t count, DType dtype, const std::string& what, int root = -1);
void broadcast(void* data, const void* from, size_t bytes, int root, const std::string& what);

// Waits until every rank has called it, on a communicator of its own (the writer threads of
// asynchronous sharded saves: the other threads' exchanges go on meanwhile). Throws Error naming
// the ranks that did not come within the deadline (the world is then broken).
void save_barrier(const std::string& what);

// What the ranks agree on before a program with collectives runs: its replicated part, the
// collectives with every node they read (the forward and backward that make the gradients) and
// every node that reads their results, with what those read (the optimizer's update and its
// hyper-parameters). What a rank computes for itself alone (a loss or an accuracy kept for
// logging on rank 0, batch norm's running statistics) is left out, and so is which values each
// rank keeps as outputs: those may differ between ranks without harm.
struct Agreement {
  uint64_t hash = 0;  // of `graph`'s structure and the backend's compile setting
  // The replicated part, renumbered in the program's order (its relative order on every rank
  // that records the same ops in the same order, with any extra ops in between); its outputs
  // are its sinks.
  std::shared_ptr<const ir::Graph> graph;
  std::vector<int32_t> scalars;  // per scalar input of `graph`: the program's scalar input
  std::string setting;           // Backend::compile_setting
};
// Null when `graph` has no collectives (ops of the table's Collective family).
std::shared_ptr<const Agreement> agreement_of(const ir::Graph& graph, const std::string& setting);

// Before a program with collectives runs (on the recording thread, at its sync): every rank
// must hold the same replicated part. Throws Error on a mismatch (naming the ranks, their
// hashes and the first differing node) or when ranks do not arrive in time (naming them).
// `origin`: the sync. `scalars`: the program's host scalar values (hyper-parameters such as the
// lr): ranks whose values in the replicated part differ would train different models from the
// same program, so they fail here too, naming the scalar's line and both values. The backend's
// compile setting (its thread count) is named when the graphs are the same and only it differs.
void agree(const Agreement& agreement, const std::string& origin,
           const std::vector<ir::ScalarValue>& scalars = {});

}  // namespace lockstep::dist::detail
