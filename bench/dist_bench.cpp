// Data parallel training speed (lockstep's side of scripts/bench-dist): a workload of
// bench/workloads.h with ls::dist::DataParallel, one fixed batch per rank (weak
// scaling: the batch is per rank), SGD. Run alone (one process) or under mpirun. Rank 0 prints:
//   result <workload> lockstep ranks R threads T img_per_s X step_ms S comm_ms C exposed_ms E
//          hidden H exposed_max_ms M
// img_per_s: over all ranks. comm_ms: the step's gradient all-reduces alone (the same buckets,
// run back to back with nothing else: median of 5); exposed_ms: how long a step waited for them
// (metrics timer all_reduce_wait), per step on the rank that waited least (the one that reached
// the wait last: it waited only for communication still in flight, while the others also waited
// for it to finish its step), averaged over the steps; exposed_max_ms: the same on the rank that
// waited most (communication and skew); hidden = 1 - exposed / comm.
// With LOCKSTEP_PROFILE set, rank 0 also prints ls::metrics::report() (time per kernel kind,
// all_reduce_start and all_reduce_wait) to stderr.
// With `zero3`, it also prints
//   gathers <workload> per_step G wait_ms W alone_ms A hidden H
// G: the parameters' gathers a step makes; W: how long a step waited for them (metrics timer
// gather_wait), on the rank that waited least (the others also waited for it: skew), M the most
// (wait_max_ms); A: G times one gather's time with nothing to hide it behind (a step that
// reads every parameter once, median of 5, per parameter); H = 1 - W / A.
// With `zero1`, the optimizer is sharded over the ranks (ls::dist::ZeroRedundancyOptimizer); with
// `zero2`, the gradients as well (each reduced to its owner); with `zero3`, the parameters too
// (ls::dist::fully_shard: each gathered where the step reads it); `zero3_keep` without
// reshard_after_forward (the backward reads the forward's gathers). bucket_mib: DataParallel's
// buckets; zero_bucket_mib: those the gradients are reduced to their owners in (stages 2 and 3).
//   dist_bench <mlp|resnet18|resnet50> [timed_steps=20] [threads=1] [bucket_mib=25]
//              [plain|zero1|zero2|zero3|zero3_keep] [zero_bucket_mib=4]
#include <lockstep/lockstep.h>
#include <sys/resource.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workload_models.h"

namespace ls = lockstep;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: dist_bench <mlp|resnet18|resnet50> [timed_steps] [threads] [bucket_mib] "
                 "[plain|zero1|zero2|zero3|zero3_keep] [zero_bucket_mib]\n");
    return 2;
  }
  try {
    ls::dist::init();
    const Workload w = workload_by_name(argv[1]);
    const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
    const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
    ls::set_num_threads(threads);
    const int rank = ls::dist::rank(), world = ls::dist::world_size();
    ls::manual_seed(static_cast<uint64_t>(rank));
    const std::shared_ptr<ls::nn::Module> model = make_model(w);
    ls::dist::DataParallelOptions dp_options;
    if (argc > 4) dp_options.bucket_bytes = static_cast<int64_t>(std::atof(argv[4]) * (1 << 20));
    ls::dist::DataParallel dp(*model, dp_options);
    auto sgd = [](std::vector<ls::Tensor> params) {
      return std::make_unique<ls::optim::SGD>(std::move(params),
                                              ls::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    };
    const std::string mode = argc > 5 ? argv[5] : "plain";
    if (mode != "plain" && mode != "zero1" && mode != "zero2" && mode != "zero3" &&
        mode != "zero3_keep")
      throw ls::Error(
          "dist_bench: the optimizer is plain, zero1, zero2, zero3 or zero3_keep, not '" + mode +
          "'");
    ls::dist::ZeroOptions zero_options{.stage = mode == "zero2" ? 2 : 1,
                                       .reshard_after_forward = mode == "zero3"};
    if (argc > 6) zero_options.bucket_bytes = static_cast<int64_t>(std::atof(argv[6]) * (1 << 20));
    std::shared_ptr<ls::optim::Optimizer> opt;
    if (mode == "zero3" || mode == "zero3_keep")
      opt = ls::dist::fully_shard(*model, sgd, zero_options);
    else if (mode == "zero1" || mode == "zero2")
      opt = std::make_unique<ls::dist::ZeroRedundancyOptimizer>(model->parameters(), sgd,
                                                                zero_options);
    else
      opt = sgd(model->parameters());
    const FixedBatch batch = fixed_batch(w);
    const ls::Tensor &images = batch.images, &labels = batch.labels;
    ls::sync();
    ls::wait();
    auto train = [&](int n) {
      for (int s = 0; s < n; ++s)
        ls::step([&] {
          opt->zero_grad();
          ls::Tensor loss = ls::nn::cross_entropy((*model)(images), labels);
          loss.backward();
          dp.average_gradients();
          opt->step();
        });
      ls::wait();
    };
    train(3);
    ls::dist::barrier();
    // Each timed step's wait for its all-reduces, on this rank (metrics timer all_reduce_wait).
    std::vector<float> waits(static_cast<size_t>(world) * steps, 0.0f);
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t progress0 = ls::metrics::timer_total_ns("all_reduce_progress");
    const int64_t gather_wait0 = ls::metrics::timer_total_ns("gather_wait");
    const int64_t gathers0 = ls::metrics::timer_count("gather_wait");
    for (int s = 0; s < steps; ++s) {
      const int64_t w0 = ls::metrics::timer_total_ns("all_reduce_wait");
      train(1);
      waits[static_cast<size_t>(s) * world + rank] =
          static_cast<float>(ls::metrics::timer_total_ns("all_reduce_wait") - w0) / 1e6f;
    }
    // The MPI calls between the program's steps that move the collectives along (their copies
    // and sums run on this thread, between the compute): rank 0's, per step.
    const double progress_ms =
        static_cast<double>(ls::metrics::timer_total_ns("all_reduce_progress") - progress0) / 1e6 /
        steps;
    const double took = seconds_since(t0);
    const auto planned = static_cast<double>(ls::metrics::counter("planned_bytes"));  // a step's
    // zero3: what a step waited for its parameters' gathers (on this rank), and how many it made.
    std::vector<float> gather_waits(static_cast<size_t>(world), 0.0f);
    gather_waits[static_cast<size_t>(rank)] = static_cast<float>(
        static_cast<double>(ls::metrics::timer_total_ns("gather_wait") - gather_wait0) / 1e6 /
        steps);
    gather_waits = ls::dist::all_reduce(ls::from_vector(gather_waits)).to_vector<float>();
    // The rank that waited least (as exposed_ms: the others also waited for the ranks behind).
    const double gather_wait_ms = *std::min_element(gather_waits.begin(), gather_waits.end());
    const double gather_wait_max_ms = *std::max_element(gather_waits.begin(), gather_waits.end());
    const double gathers =
        static_cast<double>(ls::metrics::timer_count("gather_wait") - gathers0) / steps;
    // What this rank holds after a training step (the comm-only runs below set every gradient).
    double params_b = 0, grads_b = 0, state_b = 0;
    const auto* zero3 = mode == "zero3" || mode == "zero3_keep"
                            ? dynamic_cast<ls::dist::ZeroRedundancyOptimizer*>(opt.get())
                            : nullptr;
    const std::vector<ls::Tensor> params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const ls::Tensor& p = params[i];
      // Under stage 3 the parameters this rank owns, and its runs of the split ones.
      if (!zero3 || zero3->owner(i) == rank) params_b += static_cast<double>(p.numel()) * 4;
      if (zero3 && zero3->owner(i) < 0) params_b += static_cast<double>(zero3->run(i).numel) * 4;
      if (p.grad().defined()) grads_b += static_cast<double>(p.grad().numel()) * 4;
    }
    // Under ZeRO, a split parameter's gradient is held by this rank's run of it.
    if (const auto* zero = dynamic_cast<ls::dist::ZeroRedundancyOptimizer*>(opt.get()))
      grads_b = static_cast<double>(zero->local_grad_numel()) * 4;
    for (const auto& [name, t] : opt->state_dict()) state_b += static_cast<double>(t.numel()) * 4;
    // Every rank's waits (each rank holds its own, at its index), then per step the least and the
    // most any rank waited: the rank that reached the wait last waited only for communication
    // still in flight; the others also waited for it to finish its step (skew).
    waits = ls::dist::all_reduce(ls::from_vector(waits, {steps, world})).to_vector<float>();
    double exposed_ms = 0, exposed_max_ms = 0;
    for (int s = 0; s < steps; ++s) {
      const auto row = waits.begin() + static_cast<std::ptrdiff_t>(s) * world;
      exposed_ms += *std::min_element(row, row + world) / steps;
      exposed_max_ms += *std::max_element(row, row + world) / steps;
    }
    // The same all-reduces alone: the gradients as DataParallel buckets them, back to back.
    double comm_ms = 0;
    if (world > 1) {
      std::vector<ls::Tensor> grads;
      for (const ls::Tensor& p : model->parameters()) grads.push_back(ls::zeros(p.shape()));
      ls::sync();
      ls::wait();
      std::vector<double> runs;
      for (int r = 0; r < 6; ++r) {
        const auto c0 = std::chrono::steady_clock::now();
        // The gradients' all-reduces as average_gradients records them, with no backward.
        ls::step([&] {
          std::vector<ls::Tensor> ps = model->parameters();
          for (size_t k = 0; k < ps.size(); ++k) ps[k].set_grad(grads[k]);
          dp.average_gradients();
        });
        ls::wait();
        if (r > 0) runs.push_back(seconds_since(c0) * 1e3);
      }
      std::sort(runs.begin(), runs.end());
      comm_ms = runs[runs.size() / 2];
    }
    // zero3: every parameter gathered once with nothing to compute between (a step that reads
    // each), median of 5: the communication a step's gathers would take if nothing hid it.
    double gather_alone_ms = 0;
    if (zero3 && world > 1) {
      std::vector<double> runs;
      for (int r = 0; r < 6; ++r) {
        const auto c0 = std::chrono::steady_clock::now();
        std::vector<ls::Tensor> reads;
        ls::step([&] {
          for (const ls::Tensor& p : params) reads.push_back(ls::sum(p));
        });
        ls::wait();
        if (r > 0) runs.push_back(seconds_since(c0) * 1e3);
      }
      std::sort(runs.begin(), runs.end());
      gather_alone_ms = runs[runs.size() / 2] / static_cast<double>(params.size());
    }
    // Memory per rank, the most of any rank: what it holds between steps (the parameters, the
    // gradients it keeps, its optimizer state), the most a step's program planned to take on
    // top of that (its working set: activations, gradients in flight, scratch), and the
    // process's peak resident size.
    auto mib = [](double bytes) { return bytes / (1 << 20); };
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    std::vector<float> mem(static_cast<size_t>(world) * 5, 0.0f);
    const float mine[5] = {static_cast<float>(mib(params_b)), static_cast<float>(mib(grads_b)),
                           static_cast<float>(mib(state_b)), static_cast<float>(mib(planned)),
                           static_cast<float>(usage.ru_maxrss / 1024.0)};
    std::copy(mine, mine + 5, mem.begin() + static_cast<std::ptrdiff_t>(rank) * 5);
    mem = ls::dist::all_reduce(ls::from_vector(mem, {world, 5})).to_vector<float>();
    float most[5] = {0, 0, 0, 0, 0};
    for (int r = 0; r < world; ++r)
      for (int k = 0; k < 5; ++k) most[k] = std::max(most[k], mem[static_cast<size_t>(r) * 5 + k]);
    if (rank == 0) {
      std::printf(
          "result %s lockstep ranks %d threads %d img_per_s %.2f step_ms %.2f comm_ms %.2f "
          "exposed_ms %.2f hidden %.3f exposed_max_ms %.2f progress_ms %.2f params_mib %.1f "
          "grads_mib %.1f state_mib %.1f planned_mib %.1f rss_mib %.1f\n",
          w.name.c_str(), world, threads, static_cast<double>(w.batch) * world * steps / took,
          took * 1e3 / steps, comm_ms, exposed_ms, comm_ms > 0 ? 1 - exposed_ms / comm_ms : 0.0,
          exposed_max_ms, progress_ms, most[0], most[1], most[2], most[3], most[4]);
      if (zero3)
        std::printf(
            "gathers %s per_step %.0f wait_ms %.2f alone_ms %.2f hidden %.3f wait_max_ms %.2f\n",
            w.name.c_str(), gathers, gather_wait_ms, gathers * gather_alone_ms,
            gathers > 0 ? 1 - gather_wait_ms / (gathers * gather_alone_ms) : 0.0,
            gather_wait_max_ms);
      std::fflush(stdout);
      if (std::getenv("LOCKSTEP_PROFILE"))
        std::fprintf(stderr, "%s", ls::metrics::report().c_str());
    }
    ls::dist::finalize();
    return 0;
  } catch (const ls::Error& e) {
    std::fprintf(stderr, "dist_bench: rank %d: %s\n", ls::dist::rank(), e.what());
    return 1;
  }
}
