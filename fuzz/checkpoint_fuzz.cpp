// load_checkpoint into a model (parameters and buffers, an int64 one included), an AdamW
// optimizer with state and the random generator. A file that does not load must leave all three
// as they were, bit for bit, as load_checkpoint promises; one that loads is undone before the next
// input, so every input meets the same state.
#include <cstdint>
#include <cstring>
#include <memory>

#include "fuzz_input.h"
#include "lockstep/autograd.h"
#include "lockstep/checkpoint.h"
#include "lockstep/runtime.h"
#include "trainee.h"

namespace {

namespace ls = lockstep;
using ls::fuzz::die;

// Every value load_checkpoint may change, as bytes.
std::vector<std::vector<uint8_t>> snapshot(const ls::fuzz::Trainee& t) {
  std::vector<ls::Tensor> tensors;
  for (auto& [name, v] : t.model->state_dict()) tensors.push_back(v);
  for (auto& [name, v] : t.optimizer->state_dict()) tensors.push_back(v);
  tensors.push_back(ls::generator_state());
  std::vector<std::vector<uint8_t>> out;
  for (const ls::Tensor& v : tensors) out.push_back(ls::fuzz::bytes_of(v));
  return out;
}

ls::fuzz::Trainee* trainee = nullptr;
ls::nn::NamedTensors* saved_model = nullptr;
ls::nn::NamedTensors* saved_optimizer = nullptr;
ls::Tensor* saved_generator = nullptr;
std::vector<std::vector<uint8_t>>* before = nullptr;

ls::nn::NamedTensors copies(const ls::nn::NamedTensors& state) {
  ls::nn::NamedTensors out;
  for (auto& [name, v] : state) out.emplace_back(name, v.detach() + 0);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ls::set_num_threads(1);
  trainee = new ls::fuzz::Trainee;
  saved_model = new ls::nn::NamedTensors(copies(trainee->model->state_dict()));
  saved_optimizer = new ls::nn::NamedTensors(copies(trainee->optimizer->state_dict()));
  saved_generator = new ls::Tensor(ls::generator_state().detach() + 0);
  ls::sync();
  before = new std::vector<std::vector<uint8_t>>(snapshot(*trainee));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ls::fuzz::InputFile input("ckpt", ".safetensors");
  if (size == 0) return 0;
  // The first byte says whether the optimizer is loaded too; the rest is the file.
  ls::optim::Optimizer* optimizer = data[0] & 1 ? trainee->optimizer.get() : nullptr;
  const std::string& path = input.write(data + 1, size - 1);
  try {
    ls::load_checkpoint(path, *trainee->model, optimizer);
  } catch (const ls::Error& e) {
    ls::fuzz::expect_names(e, path);
    if (snapshot(*trainee) != *before) die("a failed load_checkpoint changed the state");
    return 0;
  }
  // Loaded: back to the state every input starts from.
  trainee->model->load_state_dict(*saved_model);
  trainee->optimizer->load_state_dict(*saved_optimizer);
  {
    ls::NoGrad no_grad;
    ls::generator_state().copy_(*saved_generator);
  }
  if (snapshot(*trainee) != *before) die("the state could not be restored after a load");
  return 0;
}
