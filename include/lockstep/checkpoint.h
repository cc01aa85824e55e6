// Training checkpoints: a model's parameters and buffers, an optimizer's state (its step count
// included), a learning-rate scheduler's state and the random generator's state, in one
// safetensors file ("model.<name>", "optimizer.<name>", "scheduler.<name>" with the scheduler's
// kind in the metadata's "scheduler", "generator.state"), so PyTorch and Hugging Face tools can
// read it.
#pragma once

#include <string>

#include "lockstep/io.h"
#include "lockstep/nn.h"
#include "lockstep/optim.h"

namespace lockstep {

// Writes atomically (a crash leaves the previous checkpoint intact). Computes pending values.
// Inside a step, the state as of the call is written once the step commits (from a step
// closure): if the step fails, nothing is written, and a failed write is raised at the next
// blocking point.
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer = nullptr, const io::Metadata& metadata = {},
                     Loc loc = Loc::current());
// The same with the scheduler's state, so that a resumed run continues its schedule exactly.
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const optim::Scheduler* scheduler,
                     const io::Metadata& metadata = {}, Loc loc = Loc::current());

// Checks the whole file against the model (and optimizer) before changing anything: a
// truncated, corrupted or mismatched file is an Error naming the problem and leaves the model,
// the optimizer and the generator as they were. Returns the metadata saved with it.
io::Metadata load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer* optimizer = nullptr, Loc loc = Loc::current());
// The same, restoring the scheduler too: an Error when the file holds no scheduler state or that
// of another kind of scheduler (checked with the rest, before anything changes).
io::Metadata load_checkpoint(const std::string& path, nn::Module& model,
                             optim::Optimizer* optimizer, optim::Scheduler* scheduler,
                             Loc loc = Loc::current());

}  // namespace lockstep
