// The model the crash tests save and load: an MLP with SGD momentum state, every value of which
// can be set to one number (the checkpoint's version).
#pragma once

#include <lockstep/lockstep.h>

namespace crash {

namespace ls = lockstep;

struct Trainee {
  ls::models::MLP model{{256, 1024, 256}};
  ls::optim::SGD opt{model.parameters(), {.lr = 0.1, .momentum = 0.9}};
  Trainee() {
    // One step, so the optimizer has its momentum buffers.
    ls::step([&] {
      opt.zero_grad();
      ls::sum(model(ls::ones({2, 256}))).backward();
      opt.step();
    });
  }
  // Every float value of the model and the optimizer set to v.
  void fill(double v) {
    ls::NoGrad no_grad;
    for (auto& [name, t] : model.state_dict()) t.fill_(v);
    for (auto& [name, t] : opt.state_dict())
      if (t.dtype() == ls::DType::F32) t.fill_(v);
  }
  // The one value every float of the model and optimizer holds, or -1 if they differ.
  double uniform_value() {
    double found = -1;
    bool first = true;
    auto visit = [&](const ls::Tensor& t) {
      for (float x : t.to_vector<float>()) {
        if (first) found = x;
        first = false;
        if (x != found) found = -2;
      }
    };
    for (auto& [name, t] : model.state_dict()) visit(t);
    for (auto& [name, t] : opt.state_dict())
      if (t.dtype() == ls::DType::F32) visit(t);
    return found < 0 ? -1 : found;
  }
};

}  // namespace crash
