// What the checkpoint loaders share (src/nn/checkpoint.cpp, src/dist/sharded_checkpoint.cpp):
// a training state read from files, checked whole, then loaded.
#pragma once

#include <string>

#include "lockstep/nn.h"
#include "lockstep/optim.h"

namespace lockstep::nn {

// How a checkpoint file names the state's tensors: "model.<name>", "optimizer.<name>",
// "scheduler.<name>", and the generator's.
inline const std::string kModelPrefix = "model.";
inline const std::string kOptimizerPrefix = "optimizer.";
inline const std::string kSchedulerPrefix = "scheduler.";
inline const std::string kGeneratorName = "generator.state";

struct TrainingState {
  NamedTensors model, optimizer, scheduler;  // by their own names (no "model." prefix)
  Tensor generator;
};

// Checks everything before anything changes (each value as a training state holds it, then each
// state against the model, optimizer and scheduler: an Error naming `who`, `source` and the
// tensor), then loads the model, the optimizer, the scheduler (after the optimizer: it sets the
// groups' lrs) and the generator.
void load_training_state(const char* who, const std::string& source, Module& model,
                         optim::Optimizer* optimizer, optim::Scheduler* scheduler,
                         const TrainingState& state, const Loc& loc);

}  // namespace lockstep::nn
