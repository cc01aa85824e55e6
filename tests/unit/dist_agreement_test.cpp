// What data-parallel ranks agree on before a program with collectives runs
// (dist::detail::agreement_of): the replicated part of the program, not which values each rank
// keeps for itself (issue 30, item 14). The programs are recorded for real (one process: the
// collectives are recorded, and the identity) and read back from the compiled graph's text.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include <lockstep/lockstep.h>

#include "dist/comm.h"
#include "ir/ir.h"

namespace ls = lockstep;

namespace {

struct Recorded {
  std::shared_ptr<const lockstep::dist::detail::Agreement> agreement;
  ls::ir::Graph graph;
};

// One data-parallel SGD step of a small MLP (gradients averaged over two ranks); `extra` runs
// inside it, after the loss, and may keep values of its own; `lr` is the optimizer's.
Recorded record_step(const std::function<void(const ls::Tensor& logits, const ls::Tensor& loss,
                                              std::vector<ls::Tensor>& kept)>& extra,
                     double lr = 0.1, int64_t batch = 8, bool scale_loss = false) {
  ls::manual_seed(3);
  ls::models::MLP model({6, 5, 3});
  ls::optim::SGD opt(model.parameters(), ls::optim::SGDOptions{.lr = lr});
  const ls::Tensor x = ls::ones({batch, 6});
  const ls::Tensor y = ls::zeros({batch}, ls::DType::I64);
  std::vector<ls::Tensor> kept;
  ls::step([&] {
    opt.zero_grad();
    const ls::Tensor logits = model(x);
    ls::Tensor loss = ls::nn::cross_entropy(logits, y);
    if (scale_loss) loss = ls::mul(loss, 2.0);
    loss.backward();
    extra(logits, loss, kept);
    // DataParallel::average_gradients records nothing in a world of one: the same op by hand.
    for (ls::Tensor p : model.parameters()) p.set_grad(ls::dist::all_reduce(p.grad(), 0.5));
    opt.step();
  });
  Recorded r;
  r.graph = ls::ir::from_text(ls::debug::last_graph_text());
  r.agreement = lockstep::dist::detail::agreement_of(r.graph, "threads 2");
  return r;
}

void nothing(const ls::Tensor&, const ls::Tensor&, std::vector<ls::Tensor>&) {}

TEST(DistAgreement, ValuesKeptByOneRankAreNotPartOfIt) {
  const Recorded plain = record_step(nothing);
  ASSERT_TRUE(plain.agreement) << "the step has collectives";
  // Rank 0 keeps the loss for its log, and computes and keeps an accuracy of its own.
  const Recorded logging =
      record_step([](const ls::Tensor& logits, const ls::Tensor& loss, std::vector<ls::Tensor>& k) {
        k.push_back(loss);
        k.push_back(ls::mean(
            ls::eq(ls::argmax(logits, {1}), ls::zeros({8}, ls::DType::I64)).to(ls::DType::F32)));
        k.push_back(ls::mul(loss, 100.0));  // a host scalar of its own, before the lr's
      });
  ASSERT_TRUE(logging.agreement);
  EXPECT_GT(logging.graph.nodes.size(), plain.graph.nodes.size());
  EXPECT_GT(logging.graph.outputs.size(), plain.graph.outputs.size());
  EXPECT_EQ(logging.agreement->hash, plain.agreement->hash)
      << ls::ir::to_text(*plain.agreement->graph) << "\nagainst\n"
      << ls::ir::to_text(*logging.agreement->graph);
  EXPECT_EQ(ls::ir::to_text(*logging.agreement->graph), ls::ir::to_text(*plain.agreement->graph));
  // The replicated part's host scalars are the lr's and the like, found in either program.
  ASSERT_EQ(logging.agreement->scalars.size(), plain.agreement->scalars.size());
  EXPECT_FALSE(plain.agreement->scalars.empty()) << "the lr is part of what the ranks agree on";
  EXPECT_LE(plain.agreement->graph->nodes.size(), plain.graph.nodes.size());
}

TEST(DistAgreement, WhatTheCollectivesReadOrWhatReadsThemIsPartOfIt) {
  const Recorded plain = record_step(nothing);
  // Another batch size changes the gradients' computation; another op on the loss too.
  EXPECT_NE(record_step(nothing, 0.1, 4).agreement->hash, plain.agreement->hash);
  EXPECT_NE(record_step(nothing, 0.1, 8, true).agreement->hash, plain.agreement->hash);
  // Another lr: the same structure, its value is compared at the agreement (agree's scalars).
  const Recorded lr = record_step(nothing, 0.2);
  EXPECT_EQ(lr.agreement->hash, plain.agreement->hash);
  EXPECT_EQ(lr.agreement->scalars, plain.agreement->scalars);
  // Another compile setting (thread count) is another agreement.
  EXPECT_NE(lockstep::dist::detail::agreement_of(plain.graph, "threads 1")->hash,
            plain.agreement->hash);
}

TEST(DistAgreement, AProgramWithoutCollectivesHasNone) {
  const ls::Tensor a = ls::ones({3});
  ls::Tensor b = ls::add(a, 1.0);
  b.to_vector<float>();
  EXPECT_EQ(
      lockstep::dist::detail::agreement_of(ls::ir::from_text(ls::debug::last_graph_text()), ""),
      nullptr);
}

}  // namespace
