// The step transaction, all of it: a step syncs on entry, journals every tensor it changes (its
// value at entry) and every tensor it makes; an exception while it is traced restores them
// (trace-time rollback); at its exit the journal becomes the rollback record of its programs,
// and if one of them fails while it runs, the step's thread restores the same values once the
// programs have run (run-time settlement), while the executor lets a program overwrite in place
// only inputs that such a restore never needs (donations).
// Not here: the public ls::step / ls::Step (step.cpp), the queue (executor.cpp).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/loc.h"
#include "runtime/context.h"

namespace lockstep::runtime {

// What a step changed, kept while its programs run: if one fails, every tensor that still holds
// the value the step gave it (`after`) goes back to its value at step entry (`before`), so a
// step that fails while it runs leaves the model as one that fails while it is traced.
struct StepRollback {
  struct Entry {
    std::weak_ptr<TensorImpl> tensor;
    ir::NodePtr before;
    std::exception_ptr before_poison;
    Tensor before_grad;
    ir::NodePtr after;
  };
  std::vector<Entry> entries;
};

// A step while it is traced, on the thread that entered it.
struct StepState {
  struct JournalEntry {
    std::weak_ptr<TensorImpl> tensor;
    ir::NodePtr node;
    std::exception_ptr poison;
    Tensor grad;
  };
  int64_t id = 0;
  Loc loc;
  std::vector<JournalEntry> journal;
  std::vector<std::weak_ptr<TensorImpl>> created;
  std::vector<std::function<void()>> closures;
  int64_t trace_start_ns = 0;
  int64_t begin_ns = 0;  // its entry, when traced (runtime/profiler.h)
};

// Enters a step: syncs the thread's pending work; throws Error if a step is already running on
// this thread, or on the runtime thread.
void begin_step(StepState& s, const Loc& loc);
// Trace-time rollback: every tensor the step changed goes back to its value at entry; the tensors
// it made are poisoned with `reason`.
void rollback_step(StepState& s, const std::string& reason);
// Commits: syncs the step's work, its journal handed over as its programs' rollback record (a
// failure to build them rolls the step back and rethrows).
void commit_step(StepState& s);
// The step running on the calling thread (null: none), and the number of steps begun so far.
StepState* active_step();
int64_t steps_begun();

// Journal hooks: a tensor's pre-step value before its first change in a step (the caller holds
// the tensor's lock), and tensors created in a step.
void journal(TensorImpl& impl);
void note_created(TensorImpl& impl);

// Inputs of a program that only it and its step's rollback record hold, which the program may
// overwrite in place: the record's pre-step values do not stop an in-place update, since a program
// that fails leaves its donated inputs as they were (or names them lost).
std::vector<bool> donatable_inputs(const std::vector<std::shared_ptr<Buffer>>& inputs,
                                   const StepRollback* rollback);
// Run-time settlement, on the thread whose steps failed while they ran, once all its programs
// have run: see transaction.cpp. Then raises the first execution error not yet raised there.
void settle_failures(Context& me);
void throw_unreported(Context& me);

}  // namespace lockstep::runtime
