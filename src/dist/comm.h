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
std::shared_ptr<InFlight> start_all_reduce(void* data, int64_t count, DType dtype,
                                           std::shared_ptr<void> keep, std::string what);
// Waits for it: Error naming `what` and the program when the deadline passes or MPI fails.
void wait(InFlight& op);
// Lets MPI move every collective in flight along (OpenMPI progresses only inside MPI calls).
void progress();
// Whether any collective is in flight (the executable then calls progress between its steps).
bool in_flight();

// Blocking forms (the ref kernels).
void all_reduce(void* data, int64_t count, DType dtype, const std::string& what);
void broadcast(void* data, size_t bytes, int root, const std::string& what);

// Before a program with collectives runs (on the recording thread, at its sync): every rank
// must hold the same graph. Throws Error on a mismatch (naming the ranks, their hashes and the
// first differing node) or when ranks do not arrive in time (naming them). `origin`: the sync.
// `scalars`: the program's host scalar values (hyper-parameters such as the lr): ranks whose
// values differ would train different models from the same program, so they fail here too,
// naming the scalar's line and both values. `setting`: the backend's compile setting (its
// thread count), named when the graphs are the same and only it differs.
void agree(uint64_t hash, const ir::Graph& graph, const std::string& origin,
           const std::vector<ir::ScalarValue>& scalars = {}, const std::string& setting = "");

// Whether `graph` has collectives (ops of the table's Collective family).
bool has_collectives(const ir::Graph& graph);

}  // namespace lockstep::dist::detail
