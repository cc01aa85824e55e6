// The pause a checkpoint puts into training, under mpirun: per rank, the time each kind of save
// keeps the training loop from its next step, for a model trained with AdamW (its state, 16 bytes
// per parameter with the parameters and moments, is what a checkpoint holds):
//   whole: one file of the whole state (ls::save_checkpoint), written by rank 0 while the other
//          ranks wait for it at the next step's collectives (data parallel's way; PyTorch's when
//          the state is gathered to one rank);
//   sharded: each rank its own part (ls::dist::save_sharded, ZeroRedundancyOptimizer), committed;
//   async: the same, returning once the rank's part is copied (ls::dist::save_sharded_async); then
//          the writers finish while the next steps run, whose time is measured too.
// Prints per kind the median over `rounds` (the largest of the ranks' pauses each time):
//   mpirun -np 2 save_bench <mlp|resnet18|resnet50> [rounds=3] DIR
#include <lockstep/dist.h>
#include <lockstep/lockstep.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "workload_models.h"

namespace ls = lockstep;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: save_bench <mlp|resnet18|resnet50> <rounds> <dir>\n");
    return 2;
  }
  try {
    ls::dist::init();
    const Workload w = workload_by_name(argv[1]);
    const int rounds = std::max(1, std::atoi(argv[2]));
    const std::string dir = argv[3];
    ls::set_num_threads(1);
    const int rank = ls::dist::rank(), world = ls::dist::world_size();
    const std::shared_ptr<ls::nn::Module> model = make_model(w);
    ls::dist::DataParallel dp(*model);
    auto adamw = [](std::vector<ls::Tensor> params) {
      return std::make_shared<ls::optim::AdamW>(std::move(params),
                                                ls::optim::AdamOptions{.lr = 1e-3});
    };
    std::shared_ptr<ls::optim::Optimizer> whole = adamw(model->parameters());
    ls::dist::ZeroRedundancyOptimizer zero(model->parameters(), adamw);
    const FixedBatch batch = fixed_batch(w);
    auto train = [&](ls::optim::Optimizer& opt, int n) {
      for (int s = 0; s < n; ++s)
        ls::step([&] {
          opt.zero_grad();
          ls::nn::cross_entropy((*model)(batch.images), batch.labels).backward();
          dp.average_gradients();
          opt.step();
        });
      ls::wait();
    };
    train(*whole, 1);
    train(zero, 1);
    int64_t params = 0;
    for (const ls::Tensor& p : model->parameters()) params += p.numel();
    // The largest of the ranks' times.
    auto max_over_ranks = [&](double ms) {
      std::vector<float> all(static_cast<size_t>(world), 0.0f);
      all[static_cast<size_t>(rank)] = static_cast<float>(ms);
      all = ls::dist::all_reduce(ls::from_vector(all, {world})).to_vector<float>();
      return static_cast<double>(*std::max_element(all.begin(), all.end()));
    };
    std::vector<double> whole_ms, sharded_ms, async_ms, overlap_ms, step_ms;
    const std::string file = dir + "/whole.safetensors", shards = dir + "/sharded";
    std::filesystem::create_directories(dir);
    for (int r = 0; r < rounds; ++r) {
      ls::dist::barrier();
      auto t0 = std::chrono::steady_clock::now();
      train(zero, 1);
      step_ms.push_back(max_over_ranks(ms_since(t0)));
      // Whole: rank 0 writes, every rank goes on to the next step, which waits for rank 0.
      ls::dist::barrier();
      t0 = std::chrono::steady_clock::now();
      if (rank == 0) ls::save_checkpoint(file, *model, whole.get());
      ls::dist::barrier();
      whole_ms.push_back(max_over_ranks(ms_since(t0)));
      t0 = std::chrono::steady_clock::now();
      ls::dist::save_sharded(shards, *model, &zero);
      sharded_ms.push_back(max_over_ranks(ms_since(t0)));
      ls::dist::barrier();
      t0 = std::chrono::steady_clock::now();
      ls::dist::save_sharded_async(shards, *model, &zero);
      async_ms.push_back(max_over_ranks(ms_since(t0)));
      // The next step, while the writers write.
      t0 = std::chrono::steady_clock::now();
      train(zero, 1);
      ls::dist::wait_for_save();
      overlap_ms.push_back(max_over_ranks(ms_since(t0)));
    }
    if (rank == 0) {
      const double wm = median(whole_ms);
      std::printf(
          "result %s ranks %d params %lld step_ms %.1f whole_ms %.1f sharded_ms %.1f async_ms %.1f "
          "step_and_writers_ms %.1f sharded_share %.3f async_share %.3f\n",
          w.name.c_str(), world, static_cast<long long>(params), median(step_ms), wm,
          median(sharded_ms), median(async_ms), median(overlap_ms), median(sharded_ms) / wm,
          median(async_ms) / wm);
      std::fflush(stdout);
    }
    ls::dist::finalize();
    return 0;
  } catch (const ls::Error& e) {
    std::fprintf(stderr, "save_bench: rank %d: %s\n", ls::dist::rank(), e.what());
    return 1;
  }
}
