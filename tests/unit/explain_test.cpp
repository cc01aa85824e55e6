// Explained recompiles (debug::last_cache_miss, debug::sites, debug::expect_steady): a cache miss
// names the first node that differs from the nearest graph compiled before at the same site, with
// the field, the old and new values and the user's line; churn gets one hint; the steady-state
// contract refuses a compile before anything runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <string>
#include <vector>

#include <lockstep/lockstep.h>
#include "backends/cpu/busy.h"
#include "io/json.h"
#include "ir/ir.h"
#include "unit/ops_test_util.h"

namespace ls = lockstep;
using ::testing::HasSubstr;

namespace {

std::string here(int line) { return "explain_test.cpp:" + std::to_string(line); }

using ops_test::Delta;

// One training step of a linear model on a batch of `rows` x 784 host values; `input_line`
// gets the line that made the batch.
struct Model {
  ls::Tensor w = ls::zeros({784, 10}).set_requires_grad();
  int input_line = 0;
  int step_line = 0;
  void step(int64_t rows, ls::DType dtype = ls::f32) {
    step_line = __LINE__ + 1;
    ls::step([&] {
      const std::vector<float> host(static_cast<size_t>(rows) * 784, 0.5f);
      input_line = __LINE__ + 1;
      ls::Tensor x = ls::from_vector(host, {rows, 784});
      if (dtype != ls::f32) x = x.to(dtype).to(ls::f32);
      ls::Tensor loss = ls::matmul(x, w).sum();
      loss.backward();
      ls::NoGrad no_grad;
      w.sub_(w.grad() * 0.01);
      w.set_grad(ls::Tensor());
    });
  }
};

}  // namespace

TEST(Explain, TheFirstCompileOfASiteSaysSo) {
  ls::Tensor w = ls::zeros({4});
  const int line = __LINE__ + 1;
  ls::step([&] { w.add_(1.0); });
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_TRUE(miss.first);
  EXPECT_EQ(miss.site, "step at " + std::string(__FILE__) + ":" + std::to_string(line));
  EXPECT_THAT(miss.text, HasSubstr("first compile at this site"));
}

// The cpu backend builds its oneDNN primitives for a thread count (oneDNN runs a primitive on
// the threads it was built for): another ls::set_num_threads compiles the same graph again, says
// why, and going back finds the first program in the cache.
TEST(Explain, AThreadCountChangeCompilesAgainAndSaysSo) {
  // The threads set, whatever else runs (as LOCKSTEP_ADAPT_THREADS=0, which the tests set).
  lockstep::backends::cpu::detail::set_load_probe(nullptr, 20'000'000, false);
  const int before = ls::num_threads();
  Model m;
  ls::set_num_threads(1);
  m.step(8);
  Delta compiles("compiles");
  m.step(8);
  EXPECT_EQ(compiles.get(), 0);
  ls::set_num_threads(2);
  m.step(8);
  EXPECT_EQ(compiles.get(), 1);
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.field, "setting") << miss.text;
  EXPECT_THAT(miss.text, HasSubstr("the same graph as one compiled here before"));
  EXPECT_THAT(miss.text, HasSubstr("cpu: 1 thread before, 2 threads now"));
  ls::set_num_threads(1);
  m.step(8);
  ls::set_num_threads(2);
  m.step(8);
  EXPECT_EQ(compiles.get(), 1);
  ls::set_num_threads(before);
}

// On a busy machine the cpu backend runs programs on fewer threads than set (backends/cpu/busy.h):
// with other processes' threads said to fill every CPU (a count of them the test gives), a
// program compiled for 2 threads compiles again for 1, says why, and breaks no steady-state
// contract; once the others are gone the first program runs again, from the cache. One sample
// of a busy moment changes nothing.
TEST(Explain, OnABusyMachineProgramsRunOnFewerThreadsAndStayInTheCache) {
  namespace cpu = lockstep::backends::cpu;
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) < 2)
    GTEST_SKIP() << "one CPU: no fewer threads to run on";
  const int before = ls::num_threads();
  ls::set_num_threads(2);
  int others = 0;
  cpu::detail::set_load_probe([&] { return others; }, 0, true);
  Model m;  // batch 40: a graph no other test here compiles, on either count
  m.step(40);
  m.step(40);
  ls::debug::expect_steady(0, ls::debug::OnRecompile::Throw);
  Delta compiles("compiles");
  others = 1 << 20;
  EXPECT_EQ(cpu::threads_for_load(2), 2) << "one busy sample";
  others = 0;
  m.step(40);
  EXPECT_EQ(compiles.get(), 0);
  others = 1 << 20;
  for (int k = 0; k < 100 && compiles.get() == 0; ++k) m.step(40);
  ASSERT_EQ(compiles.get(), 1);
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.field, "setting") << miss.text;
  EXPECT_THAT(miss.text, HasSubstr("cpu: 2 threads before, 1 thread (2 set; other processes busy "
                                   "the cores) now"));
  m.step(40);
  others = 0;
  for (int k = 0; k < 100 && cpu::threads_for_load(2) == 1; ++k) m.step(40);
  m.step(40);
  EXPECT_EQ(cpu::threads_for_load(2), 2);
  EXPECT_EQ(compiles.get(), 1) << "the 2-thread program again, from the cache";
  ls::debug::stop_expecting_steady();
  cpu::detail::set_load_probe(nullptr, 20'000'000, false);  // off, as the tests run
  ls::set_num_threads(before);
}

TEST(Explain, ABatchSizeChangeNamesTheInputItsLineAndBothShapes) {
  Model m;
  m.step(32);
  m.step(32);
  const int64_t before = ls::debug::last_cache_miss().compiles_at_site;
  Delta compiles("compiles");
  m.step(48);
  EXPECT_EQ(compiles.get(), 1);
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.compiles_at_site, before + 1) << "the site's compiles (other tests share it)";
  EXPECT_FALSE(miss.first);
  EXPECT_EQ(miss.field, "shape");
  EXPECT_EQ(miss.before, "f32[32, 784]");
  EXPECT_EQ(miss.after, "f32[48, 784]");
  EXPECT_THAT(miss.where, HasSubstr(here(m.input_line)));
  EXPECT_GT(miss.more, 0) << "the shapes computed from it differ too";
  EXPECT_THAT(miss.text, HasSubstr("shape f32[32, 784] -> f32[48, 784]"));
  EXPECT_THAT(miss.text, HasSubstr(here(m.input_line)));
}

TEST(Explain, ADtypeChangeIsNamed) {
  Model m;
  m.step(8);
  m.step(8, ls::f64);
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.field, "op") << miss.text;  // a cast appears where there was none
  EXPECT_EQ(miss.after, "cast");
  EXPECT_THAT(miss.where, HasSubstr(here(m.input_line + 1)));
}

TEST(Explain, AnAttributeChangeNamesTheOpAndItsLine) {
  const ls::Tensor x = ls::ones({1, 1, 8, 8});
  int line = 0;
  auto pooled = [&](int64_t stride) {
    line = __LINE__ + 1;
    return ls::max_pool2d(x, {.kernel = {2, 2}, .stride = {stride, stride}}).sum().item<float>();
  };
  pooled(2);
  pooled(1);
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.site, "item at " + std::string(__FILE__) + ":" + std::to_string(line));
  EXPECT_EQ(miss.op, "max_pool2d");
  EXPECT_EQ(miss.field, "shape") << "the output shape is the first thing a stride changes";
  EXPECT_THAT(miss.where, HasSubstr(here(line)));
}

TEST(Explain, AStructuralChangeIsNamed) {
  const ls::Tensor x = ls::ones({16});
  int line = 0;
  auto compute = [&](bool extra) {
    ls::Tensor y = x * 2;
    line = __LINE__ + 1;
    if (extra) y = ls::relu(y);
    return (y + 1).sum().item<float>();
  };
  compute(false);
  compute(true);
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.field, "op");
  EXPECT_EQ(miss.after, "relu");
  EXPECT_THAT(miss.where, HasSubstr(here(line)));
}

TEST(Explain, TheNearestOfSeveralCachedVariantsIsChosen) {
  // Variants with 101, 102 and 103 rows; 104 rows is nearest to all alike (the input's shape is
  // the first difference of each): the most recent is taken.
  Model m;
  for (int64_t rows : {101, 102, 103}) m.step(rows);
  m.step(104);
  EXPECT_EQ(ls::debug::last_cache_miss().before, "f32[103, 784]");
  // A variant that shares more with the new graph wins over a more recent one.
  Model other;
  other.step(105);
  other.step(105, ls::f64);
  other.step(106);
  EXPECT_EQ(ls::debug::last_cache_miss().before, "f32[105, 784]") << "the f32 variant, not f64";
  EXPECT_EQ(ls::debug::last_cache_miss().field, "shape");
}

TEST(Explain, SitesCountCompilesHitsAndReads) {
  ls::metrics::reset();
  Model m;
  for (int i = 0; i < 3; ++i) m.step(4);
  const int read_line = __LINE__ + 1;
  (void)m.w.sum().item<float>();
  // A read inside a step: an implicit sync that cuts the step's graph, counted as such.
  ls::Tensor t = ls::ones({3});
  int in_step_line = 0;
  ls::step([&] {
    t.add_(1.0);
    in_step_line = __LINE__ + 1;
    (void)t.sum().item<float>();
  });
  const std::string step_site =
      "step at " + std::string(__FILE__) + ":" + std::to_string(m.step_line);
  const std::string read_site =
      "item at " + std::string(__FILE__) + ":" + std::to_string(read_line);
  bool saw_step = false, saw_read = false, saw_in_step = false;
  for (const ls::debug::SiteStats& s : ls::debug::sites()) {
    if (s.site == step_site) {
      saw_step = true;
      EXPECT_EQ(s.syncs, 3);
      EXPECT_EQ(s.cache_hits + s.compiles, 3);
      EXPECT_GT(s.nodes, 0);
    }
    if (s.site == read_site) {
      saw_read = true;
      EXPECT_EQ(s.syncs, 1);
      EXPECT_EQ(s.in_step, 0);
    }
    if (s.site == "item at " + std::string(__FILE__) + ":" + std::to_string(in_step_line)) {
      saw_in_step = true;
      EXPECT_EQ(s.syncs, 1);
      EXPECT_EQ(s.in_step, 1);
    }
  }
  EXPECT_TRUE(saw_step);
  EXPECT_TRUE(saw_read);
  EXPECT_TRUE(saw_in_step);
}

TEST(Explain, AChurningShapeGetsOneHint) {
  // A site of its own (a step at this test's lines), batches of a new size every step.
  ls::Tensor w = ls::zeros({3});
  std::vector<std::string> hints;
  for (int64_t rows = 10; rows < 16; ++rows) {
    ls::step([&] {
      w.add_(ls::from_vector(std::vector<float>(rows * 3, 1.0f), {rows, 3}).sum({0}));
    });
    hints.push_back(ls::debug::last_cache_miss().hint);
  }
  // Misses 2, 3, 4 differ in the same node's shape: the hint comes with the third in a row.
  int given = 0;
  for (const std::string& h : hints) given += !h.empty();
  EXPECT_EQ(given, 1);
  EXPECT_THAT(hints[3], HasSubstr("changes from step to step"));
  EXPECT_THAT(hints[3], HasSubstr("Keep shapes fixed"));
}

TEST(Explain, TheSteadyContractRefusesACompileBeforeAnythingRuns) {
  Model m;
  m.step(6);
  m.step(6);
  ls::debug::expect_steady(0);
  m.step(6);  // a cache hit: allowed
  const std::vector<uint32_t> before = ops_test::bits(m.w);
  Delta executions("executions"), rollbacks("rollbacks");
  std::string message;
  try {
    m.step(9);
  } catch (const ls::Error& e) {
    message = e.what();
  }
  ls::debug::stop_expecting_steady();
  EXPECT_THAT(message, HasSubstr("expect_steady: a compile past the steady state"));
  EXPECT_THAT(message, HasSubstr("shape f32[6, 784] -> f32[9, 784]"));
  EXPECT_THAT(message, HasSubstr(here(m.input_line)));
  EXPECT_EQ(executions.get(), 0);
  EXPECT_EQ(rollbacks.get(), 1);
  EXPECT_EQ(ops_test::bits(m.w), before);
  // Warn instead: the compile happens, with a warning.
  ls::debug::expect_steady(0, ls::debug::OnRecompile::Warn);
  EXPECT_NO_THROW(m.step(9));
  ls::debug::stop_expecting_steady();
  EXPECT_THROW(ls::debug::expect_steady(-1), ls::Error);
}

TEST(Explain, ModuleErrorsNameTheCallersLineAndTheModule) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const ls::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ls::nn::Sequential linear;
  linear.emplace<ls::nn::Linear>(32, 64);
  int line = __LINE__ + 1;
  std::string m = message([&] { linear(ls::ones({8, 31})); });
  EXPECT_THAT(m, HasSubstr("[8, 31] x [32, 64] (31 vs 32)"));
  EXPECT_THAT(m, HasSubstr("(at " + std::string(__FILE__) + ":" + std::to_string(line) + " in 0)"));
  EXPECT_EQ(m.find("layers.cpp"), std::string::npos) << m;

  ls::nn::Sequential net;
  net.emplace<ls::nn::Conv2d>(ls::nn::Conv2dSpec{.in_channels = 3, .out_channels = 8});
  net.emplace<ls::nn::BatchNorm>(16);
  line = __LINE__ + 1;
  m = message([&] { net(ls::ones({2, 4, 8, 8})); });
  EXPECT_THAT(m, HasSubstr("has 4 channels but weight [8, 3, 3, 3] expects 3"));
  EXPECT_THAT(m, HasSubstr(here(line) + " in 0)"));
  line = __LINE__ + 1;
  m = message([&] { net(ls::ones({2, 3, 8, 8})); });
  EXPECT_THAT(m, HasSubstr("BatchNorm: input [2, 8, 6, 6] has 8 channels, the layer expects 16"));
  EXPECT_THAT(m, HasSubstr(here(line) + " in 1)"));

  // A module of the user's own: its forward's lines are the user's, and nested paths join.
  struct Block : ls::nn::Module {
    std::shared_ptr<ls::nn::Sequential> body;
    int line = 0;
    Block() {
      body = register_module("body", std::make_shared<ls::nn::Sequential>());
      body->emplace<ls::nn::Linear>(4, 4);
    }
    ls::Tensor forward(const ls::Tensor& x) override {
      line = __LINE__ + 1;
      return (*body)(x);
    }
  };
  ls::nn::Sequential outer;
  auto block = std::make_shared<Block>();
  outer.add(block);
  m = message([&] { outer(ls::ones({2, 5})); });
  EXPECT_THAT(m, HasSubstr(here(block->line) + " in 0.body.0)"));
}

TEST(Explain, AMissInsideAModelNamesTheUsersLineAndTheModule) {
  ls::nn::Sequential model;
  model.emplace<ls::nn::Linear>(4, 8);
  const ls::Tensor x = ls::ones({2, 4});
  int line = 0;
  auto run = [&] {
    line = __LINE__ + 1;
    return model(x).sum().item<float>();
  };
  run();
  model.emplace<ls::nn::ReLU>();  // a layer added: the graph's structure changes
  run();
  const ls::debug::CacheMiss miss = ls::debug::last_cache_miss();
  EXPECT_EQ(miss.field, "op") << miss.text;
  EXPECT_EQ(miss.after, "relu");
  EXPECT_EQ(miss.module, "1");
  EXPECT_THAT(miss.where, HasSubstr(here(line)));
  EXPECT_THAT(miss.text, HasSubstr(here(line) + " in 1)"));
}

TEST(Explain, TheJsonReportHasTheSchemaAndTheEventsCounts) {
  ls::metrics::reset();
  ls::Tensor w = ls::zeros({5});
  (void)w.sum().item<float>();
  const int line = __LINE__ + 1;
  for (int64_t n : {3, 3, 4}) ls::step([&] { w.add_(ls::ones({n}).sum()); });
  const ls::io::json::Value root = ls::io::json::parse(ls::metrics::report_json());
  auto member = [](const ls::io::json::Value& v, const std::string& key) {
    for (const auto& m : v.object)
      if (m.key == key) return m.value;
    ADD_FAILURE() << "no key " << key;
    return ls::io::json::Value{};
  };
  EXPECT_EQ(member(root, "schema").text, "lockstep-metrics/1");
  EXPECT_EQ(member(member(root, "counters"), "steps").integer, 3);
  EXPECT_EQ(member(member(root, "counters"), "implicit_syncs").integer, 1);
  const ls::io::json::Value sites = member(root, "sites");
  ASSERT_EQ(sites.kind, ls::io::json::Value::Kind::Array);
  const std::string step_site = "step at " + std::string(__FILE__) + ":" + std::to_string(line);
  bool found = false;
  for (const ls::io::json::Value& s : sites.array) {
    if (member(s, "site").text != step_site) continue;
    found = true;
    EXPECT_EQ(member(s, "syncs").integer, 3);
    EXPECT_EQ(member(s, "compiles").integer, 2);
    EXPECT_EQ(member(s, "cache_hits").integer, 1);
    // The cpu backend plans the step's memory: at least its output (w, 5 floats).
    EXPECT_GE(member(s, "planned_bytes").integer, 20);
    const ls::io::json::Value misses = member(s, "misses");
    EXPECT_EQ(member(misses, "first").integer, 1);
    EXPECT_EQ(member(misses, "shape").integer, 1);
    // Per-site timers: three steps traced, built and run, two compiled.
    const ls::io::json::Value timers = member(s, "timers");
    ls::wait();
    for (const auto& [phase, n] :
         std::vector<std::pair<std::string, int64_t>>{{"trace", 3}, {"graph", 3}, {"compile", 2}}) {
      const ls::io::json::Value t = member(timers, phase);
      EXPECT_EQ(member(t, "count").integer, n) << phase;
      // Fractions are kept as their text by lockstep's JSON reader.
      const double median = std::stod(member(t, "median_ms").text);
      EXPECT_GT(median, 0) << phase;
      EXPECT_GE(std::stod(member(t, "p90_ms").text), median) << phase;
    }
  }
  ls::wait();  // every program ran: three executions at the step's site
  const ls::io::json::Value again = ls::io::json::parse(ls::metrics::report_json());
  for (const ls::io::json::Value& s : member(again, "sites").array)
    if (member(s, "site").text == step_site) {
      EXPECT_EQ(member(member(member(s, "timers"), "execute"), "count").integer, 3);
    }
  EXPECT_TRUE(found) << ls::metrics::report_json();
  const ls::io::json::Value last = member(root, "last_cache_miss");
  EXPECT_EQ(member(last, "field").text, "shape");
  EXPECT_EQ(member(last, "site").text, step_site);
  EXPECT_THAT(ls::metrics::report(), HasSubstr(step_site));
}

TEST(Explain, GraphDumpsNameLinesAndDiffShowsTheChangedRegion) {
  const ls::Tensor x = ls::ones({4});
  const int line = __LINE__ + 1;
  (void)(ls::exp(x) * 2).sum().item<float>();
  const std::string a = ls::debug::last_graph_text();
  EXPECT_THAT(a, HasSubstr("  # " + std::string(__FILE__) + ":" + std::to_string(line)));
  (void)(ls::exp(x) * 3 + 1).sum().item<float>();
  const std::string b = ls::debug::last_graph_text();
  EXPECT_EQ(ls::debug::diff(a, a), "");
  const std::string d = ls::debug::diff(a, b);
  EXPECT_THAT(d, HasSubstr("@@ -"));
  EXPECT_THAT(d, HasSubstr("\n+%")) << d;
  EXPECT_THAT(d, HasSubstr("= add(")) << d;
  // The text with comments reads back as the same graph.
  EXPECT_EQ(ls::ir::to_text(ls::ir::from_text(b)),
            ls::ir::to_text(ls::ir::from_text(ls::ir::to_text(ls::ir::from_text(b)))));
}

TEST(Explain, DiffOfTextsIsAUnifiedDiff) {
  EXPECT_EQ(ls::debug::diff("a\nb\nc\nd\ne\nf\n", "a\nb\nc\nX\ne\nf\n"),
            "@@ -2,5 +2,5 @@\n b\n c\n-d\n+X\n e\n f\n");
  EXPECT_EQ(ls::debug::diff("a\n", "a\nb\n"), "@@ -1,1 +1,2 @@\n a\n+b\n");
}

TEST(Explain, AGraphGrowingWithoutASyncWarnsOnceNamingTheLine) {
  ls::debug::set_pending_graph_limit(2000);
  Delta warnings("pending_graph_warnings");
  ls::Tensor acc = ls::zeros({4});
  ::testing::internal::CaptureStderr();
  int line = 0;
  for (int i = 0; i < 3000; ++i) {
    line = __LINE__ + 1;
    acc = acc + 1;  // no step, no sync: the graph only grows
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.get(), 1);
  EXPECT_THAT(err, HasSubstr("nodes pending on this thread"));
  EXPECT_THAT(err, HasSubstr("is a step boundary (ls::step, ls::sync) missing?"));
  EXPECT_THAT(err, HasSubstr(here(line) + " (")) << err;
  EXPECT_EQ(acc.to_vector<float>()[0], 3000.0f);
  ls::debug::set_pending_graph_limit(0);
}

// A generation loop reads one value per iteration: what it reads is computed, so however many
// nodes it records between syncs, little is pending and nothing is missing: no warning.
TEST(Explain, ALoopThatReadsEachIterationIsNotWarnedAbout) {
  ls::debug::set_pending_graph_limit(2000);
  Delta warnings("pending_graph_warnings");
  ls::Tensor token = ls::zeros({1});
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3000; ++i) {
    token = token + 1;
    (void)token.item<float>();  // a read: only what it needs is computed; no ls::sync
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings.get(), 0) << err;
  EXPECT_THAT(err, ::testing::Not(HasSubstr("pending on this thread")));
  ls::debug::set_pending_graph_limit(0);
}

TEST(Explain, GradientNodesNameTheForwardOpItsLineAndModule) {
  ls::nn::Sequential model;
  model.emplace<ls::nn::Linear>(4, 3);
  int line = 0;
  ls::step([&] {
    line = __LINE__ + 1;
    ls::Tensor loss = model(ls::ones({2, 4})).sum();
    loss.backward();
  });
  const std::string text = ls::debug::last_graph_text();
  EXPECT_THAT(text, HasSubstr(here(line) + " in 0 (backward of matmul)")) << text;
}

// The contract's bound on implicit syncs per step: the second read inside a step, with a bound of
// one, throws before it syncs anything, and the step rolls back.
TEST(Explain, TheContractBoundsImplicitSyncsPerStep) {
  ls::Tensor w = ls::zeros({3});
  ls::sync();
  ls::wait();
  // Compiles stay allowed (a warm-up of 100 syncs); implicit syncs are bounded from now on.
  ls::debug::expect_steady(100, ls::debug::OnRecompile::Throw, 1);
  float first = -1;
  try {
    ls::step([&] {
      w.add_(1.0);
      first = w.sum().item<float>();  // the first: allowed
      w.add_(1.0);
      const int line = __LINE__ + 1;
      (void)w.sum().item<float>();
      ADD_FAILURE() << "the second read at line " << line << " should have thrown";
    });
    ADD_FAILURE() << "the step should have failed";
  } catch (const ls::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("implicit sync number 2"));
    EXPECT_THAT(e.what(), HasSubstr("item at " + std::string(__FILE__)));
  }
  ls::debug::stop_expecting_steady();
  EXPECT_EQ(first, 3.0f);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 0, 0})) << "the step rolled back";
  // Without a bound, any number of reads.
  ls::debug::expect_steady(100, ls::debug::OnRecompile::Throw);
  ls::step([&] {
    for (int k = 0; k < 3; ++k) (void)w.sum().item<float>();
  });
  ls::debug::stop_expecting_steady();
}

// Graph dumps name the parameters and buffers a program reads by their module path.
TEST(Explain, DumpsNameParametersByModulePath) {
  ls::nn::Sequential model;
  model.emplace<ls::nn::Linear>(4, 3);
  model.emplace<ls::nn::ReLU>();
  auto block = std::make_shared<ls::nn::Sequential>();
  block->emplace<ls::nn::Linear>(3, 2);
  block->emplace<ls::nn::BatchNorm1d>(2);
  model.add(block);
  ls::optim::SGD opt(model.parameters(), {.lr = 0.1});
  const ls::Tensor x = ls::ones({5, 4});
  for (int s = 0; s < 2; ++s)
    ls::step([&] {
      opt.zero_grad();
      model(x).sum().backward();
      opt.step();
    });
  const std::string text = ls::debug::last_graph_text();
  for (const char* name :
       {"holds 0.weight", "holds 0.bias", "holds 2.0.weight", "holds 2.1.running_mean"})
    EXPECT_THAT(text, HasSubstr(name)) << text;
}

// Batch norm's output is a value with a gradient function of its own (an annotated copy of the
// node that computed it): the copy keeps the node's origin, so the dump names its module.
TEST(Explain, BatchNormsOutputKeepsItsModulePathInTheDump) {
  ls::nn::Sequential model;
  model.emplace<ls::nn::Linear>(4, 3);
  model.emplace<ls::nn::BatchNorm1d>(3);
  model.emplace<ls::nn::ReLU>();
  ls::step([&] { model(ls::randn({5, 4})).sum().backward(); });
  const std::string text = ls::debug::last_graph_text();
  // The relu's operand is batch norm's output.
  const size_t relu = text.find("relu(%");
  ASSERT_NE(relu, std::string::npos) << text;
  const std::string operand = text.substr(relu + 5, text.find(')', relu) - relu - 5);
  const size_t at = text.find("\n" + operand + " = ");
  ASSERT_NE(at, std::string::npos) << operand << "\n" << text;
  const std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  EXPECT_THAT(line, HasSubstr(" in 1")) << line;
}
