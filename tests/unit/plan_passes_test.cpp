// The compiler's passes (src/plan/, src/backends/cpu/passes.h), plan text in, plan text out: each
// test writes a small graph as IR text, runs the cpu pipeline up to one pass and compares the
// plan's text (every node's decisions and the steps) with what that pass must decide.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cpu/fused.h"
#include "backends/cpu/passes.h"
#include "ir/ir.h"
#include "plan/passes.h"
#include "plan/pipeline.h"
#include "util/check.h"

namespace ir = lockstep::ir;
namespace plan = lockstep::plan;
namespace cpu = lockstep::backends::cpu;

namespace {

// The plan after the cpu pipeline's passes up to and including `last`.
plan::Plan run_until(const std::string& graph_text, const std::string& last) {
  plan::Plan p(ir::from_text(graph_text));
  for (const plan::Pass& pass : cpu::pipeline()) {
    pass.run(p);
    if (pass.name == last) return p;
  }
  ADD_FAILURE() << "no pass " << last;
  return p;
}

// The lines of the plan's text that start with `prefix` ("node", "%", "output", "arena").
std::string lines(const plan::Plan& p, const std::string& prefix) {
  const std::string text = plan::to_text(p, true);
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t eol = text.find('\n', at);
    const std::string line = text.substr(at, eol - at);
    if (line.rfind(prefix, 0) == 0) out += line + "\n";
    at = eol + 1;
  }
  return out;
}

}  // namespace

TEST(PlanText, GraphTextRoundTrips) {
  const std::string text =
      "graph(cpu, buffers=2, scalars=1)\n"
      "%0 = data(#0) f32[4, 8]\n"
      "%1 = data(#1) i64[4]\n"
      "%2 = scalar($0) f32[]\n"
      "%3 = sum(%0) {1} f32[4]\n"
      "%4 = gather(%3, %1) {0} f32[4]\n"
      "return %4, %3\n";
  EXPECT_EQ(ir::to_text(ir::from_text(text)), text);
}

TEST(PlanText, BadGraphTextNamesTheLine) {
  try {
    ir::from_text("%0 = data(#0) f32[4]\n%1 = frobnicate(%0) f32[4]\n");
    ADD_FAILURE() << "parsed";
  } catch (const lockstep::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: unknown op 'frobnicate'"), std::string::npos)
        << e.what();
  }
}

namespace {

const char* const kConv = "{1, 1, 1, 1, 1, 1, 1}";  // stride 1, padding 1, dilation 1, groups 1

std::string conv_graph(const std::string& tail) {
  return std::string("%0 = data(#0) f32[2, 16, 8, 8]\n") + "%1 = data(#1) f32[16, 16, 3, 3]\n" +
         "%2 = conv2d(%0, %1) " + kConv + " f32[2, 16, 8, 8]\n" +
         "%3 = relu(%2) f32[2, 16, 8, 8]\n" + "%4 = conv2d(%3, %1) " + kConv +
         " f32[2, 16, 8, 8]\n" + "%5 = relu(%4) f32[2, 16, 8, 8]\n" + tail;
}

// An SGD update w - lr * g (w may be overwritten in place) next to a step that checks its data.
std::string update_with(const std::string& checked) {
  return "%0 = data(#0) f32[1024]\n%1 = data(#1) f32[1024]\n%2 = scalar($0) f32[]\n"
         "%3 = expand(%2) f32[1024]\n%4 = mul(%1, %3) f32[1024]\n%5 = sub(%0, %4) f32[1024]\n" +
         checked + "return %5, %8\n";
}

}  // namespace

TEST(FusionPass, ASmallTreeReadTwiceIsRecomputedALargeOneStored) {
  // exp(x) feeds two outputs: recomputed in each (one leaf read twice costs less than a store
  // and two loads). The sum of five inputs feeds two: stored once (five leaves read twice would
  // cost more).
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[1024]\n"
      "%1 = exp(%0) f32[1024]\n"
      "%2 = add(%1, %0) f32[1024]\n"
      "%3 = mul(%1, %0) f32[1024]\n"
      "%4 = data(#1) f32[1024]\n"
      "%5 = data(#2) f32[1024]\n"
      "%6 = data(#3) f32[1024]\n"
      "%7 = data(#4) f32[1024]\n"
      "%8 = add(%0, %4) f32[1024]\n"
      "%9 = add(%8, %5) f32[1024]\n"
      "%10 = add(%9, %6) f32[1024]\n"
      "%11 = add(%10, %7) f32[1024]\n"
      "%12 = neg(%11) f32[1024]\n"
      "%13 = exp(%11) f32[1024]\n"
      "return %2, %3, %12, %13\n",
      "choose_fusion");
  EXPECT_EQ(lines(p, "node"),
            "node %0 data f32[1024]\n"
            "node %1 exp f32[1024] absorbed\n"
            "node %2 add f32[1024] output\n"
            "node %3 mul f32[1024] output\n"
            "node %4 data f32[1024]\n"
            "node %5 data f32[1024]\n"
            "node %6 data f32[1024]\n"
            "node %7 data f32[1024]\n"
            "node %8 add f32[1024] absorbed\n"
            "node %9 add f32[1024] absorbed\n"
            "node %10 add f32[1024] absorbed\n"
            "node %11 add f32[1024]\n"
            "node %12 neg f32[1024] output\n"
            "node %13 exp f32[1024] output\n");
}

TEST(LayoutPass, ValuesBetweenConvolutionsStayBlocked) {
  // conv -> relu -> conv -> relu: the first convolution's output and the relu the second reads
  // stay in nChw16c; the second's output is read by the tree that makes the (plain) output.
  EXPECT_EQ(lines(run_until(conv_graph("return %5\n"), "choose_layouts"), "node"),
            "node %0 data f32[2, 16, 8, 8]\n"
            "node %1 data f32[16, 16, 3, 3]\n"
            "node %2 conv2d f32[2, 16, 8, 8] nChw16c\n"
            "node %3 relu f32[2, 16, 8, 8] nChw16c\n"
            "node %4 conv2d f32[2, 16, 8, 8]\n"
            "node %5 relu f32[2, 16, 8, 8] output\n");
}

TEST(LayoutPass, AValueWithAPlainReaderStaysPlainAndSoDoesItsClass) {
  // The relu is also reshaped (a reader that needs the plain layout): it stays plain, and so
  // does the convolution output its tree walks in the same order.
  EXPECT_EQ(lines(run_until(conv_graph("%6 = reshape(%3) f32[2, 1024]\nreturn %5, %6\n"),
                            "choose_layouts"),
                  "node"),
            "node %0 data f32[2, 16, 8, 8]\n"
            "node %1 data f32[16, 16, 3, 3]\n"
            "node %2 conv2d f32[2, 16, 8, 8]\n"
            "node %3 relu f32[2, 16, 8, 8]\n"
            "node %4 conv2d f32[2, 16, 8, 8]\n"
            "node %5 relu f32[2, 16, 8, 8] output\n"
            "node %6 reshape f32[2, 1024] output\n");
}

TEST(ChecksAndDonations, AnIndexCheckRunsBeforeTheInPlaceUpdate) {
  // The gather's index check moves to the front: when the update overwrites w (step 2), no
  // check is left to fail, so a failed run never needs w back (nothing is copied aside).
  const plan::Plan p = run_until(
      update_with("%6 = data(#2) i64[4]\n%7 = data(#3) f32[8]\n%8 = gather(%7, %6) {0} f32[4]\n"),
      "plan_memory");
  EXPECT_EQ(lines(p, "arena"),
            "arena 64 bytes, 4 steps, last check at step 0, 1 steps before outputs\n");
  EXPECT_EQ(lines(p, "%"),
            "%8 check f32[4] <- %6[4]  check of gather %8\n"
            "%2 scalar f32[] <-  \n"
            "%5 fused f32[1024] <- %0[1024] %1[1024] %2[]  sub(r0,r1*r2)->r4 \n"
            "%8 gather f32[4] <- %7[8] %6[4]  \n");
  EXPECT_EQ(lines(p, "output"), "output 0 may overwrite input 0 at step 2\n");
  EXPECT_LT(p.last_can_fail, p.donor_step[0]);
}

TEST(ChecksAndDonations, AnUpdateBeforeAStepThatMayFailIsMarkedForACopy) {
  // Integer division checks its divisor where it runs, after the update: the update's step (1)
  // precedes the last step that may fail (2), which tells the executable to keep w's old value
  // aside while it runs (run-time rollback).
  const plan::Plan p = run_until(
      update_with("%6 = data(#2) i64[4]\n%7 = data(#3) i64[4]\n%8 = div(%6, %7) i64[4]\n"),
      "plan_memory");
  EXPECT_EQ(lines(p, "arena"),
            "arena 64 bytes, 3 steps, last check at step 2, 1 steps before outputs\n");
  EXPECT_EQ(lines(p, "output"), "output 0 may overwrite input 0 at step 1\n");
  EXPECT_LT(p.donor_step[0], p.last_can_fail);
}

TEST(SchedulePass, AWeightGradientMovesNextToItsInputGradient) {
  const std::string conv = kConv;
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[2, 16, 8, 8]\n%1 = data(#1) f32[16, 16, 3, 3]\n"
      "%2 = data(#2) f32[2, 16, 8, 8]\n"
      "%3 = conv2d_backward_input(%2, %1) " +
          conv + " f32[2, 16, 8, 8]\n%4 = conv2d(%0, %1) " + conv +
          " f32[2, 16, 8, 8]\n%5 = conv2d_backward_weight(%0, %2) " + conv +
          " f32[16, 16, 3, 3]\nreturn %3, %4, %5\n",
      "schedule");
  EXPECT_EQ(lines(p, "%"),
            "%3 conv2d_backward_input f32[2, 16, 8, 8] <- %2[2, 16, 8, 8] %1[16, 16, 3, 3]  \n"
            "%5 conv2d_backward_weight f32[16, 16, 3, 3] <- %0[2, 16, 8, 8] %2[2, 16, 8, 8]  \n"
            "%4 conv2d f32[2, 16, 8, 8] <- %0[2, 16, 8, 8] %1[16, 16, 3, 3]  \n");
}

TEST(MergePass, SumsOverOneLayoutWalkTogether) {
  // Batch norm's backward: the sum of x and the sum of x * y per channel read x once.
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[2, 16, 8, 8]\n%1 = data(#1) f32[2, 16, 8, 8]\n"
      "%2 = sum(%0) {1, 0, 2, 3} f32[1, 16, 1, 1]\n%3 = mul(%0, %1) f32[2, 16, 8, 8]\n"
      "%4 = sum(%3) {1, 0, 2, 3} f32[1, 16, 1, 1]\nreturn %2, %4\n",
      "merge_sums");
  EXPECT_EQ(lines(p, "%"),
            "%2 sums f32[1, 16, 1, 1] <- %0[2, 16, 8, 8] %1[2, 16, 8, 8]  ; mul(r0,r1)->r2 \n");
}

TEST(MemoryPass, TheArenaReusesDeadValues) {
  // A chain of matmuls: each value dies once the next is computed, so two slots suffice.
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[256, 256]\n%1 = mat_mul(%0, %0) f32[256, 256]\n"
      "%2 = mat_mul(%1, %1) f32[256, 256]\n%3 = mat_mul(%2, %2) f32[256, 256]\n"
      "%4 = mat_mul(%3, %3) f32[256, 256]\nreturn %4\n",
      "plan_memory");
  EXPECT_EQ(lines(p, "node"),
            "node %0 data f32[256, 256] slot input@0\n"
            "node %1 mat_mul f32[256, 256] slot arena@0\n"
            "node %2 mat_mul f32[256, 256] slot arena@262144\n"
            "node %3 mat_mul f32[256, 256] slot arena@0\n"
            "node %4 mat_mul f32[256, 256] output slot output@0\n");
  EXPECT_EQ(p.arena_bytes, 2u * 256 * 256 * 4);
  EXPECT_EQ(p.planned.total(),
            p.arena_bytes + 256u * 256 * 4 + p.planned.scratch + p.planned.constants);
}

TEST(Pipeline, ThePassesInOrder) {
  std::vector<std::string> names;
  for (const plan::Pass& pass : cpu::pipeline()) names.push_back(pass.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "fold_constants", "choose_fusion", "choose_layouts",
                       "choose_conv_algorithms", "fuse_attention", "lower", "drop_unread_steps",
                       "merge_row_steps", "merge_sums", "merge_fused_steps", "schedule",
                       "add_checks", "bucket_all_reduces", "prefetch_gathers", "join_broadcasts",
                       "overlap_broadcasts", "share_conv_copies", "plan_memory"}));
}

// A causal attention and its backward as autograd records them: two steps, reading q, k and v
// where they are (k through the transpose's strides), writing the output, the row max and sum,
// and the three gradients; none of the [2, 6, 6] scores or their gradients is a value.
TEST(AttentionPass, AnAttentionAndItsBackwardAreTwoSteps) {
  const std::string graph =
      "graph(cpu, buffers=5, scalars=3)\n"
      "%0 = data(#0) f32[2, 6, 4]\n%1 = data(#1) f32[2, 6, 4]\n%2 = data(#2) f32[2, 6, 4]\n"
      "%3 = data(#3) bool[6, 6]\n%4 = data(#4) f32[2, 6, 4]\n"
      "%5 = permute(%1) {0, 2, 1} f32[2, 4, 6]\n%6 = mat_mul(%0, %5) f32[2, 6, 6]\n"
      "%7 = scalar($0) f32[]\n%8 = expand(%7) f32[2, 6, 6]\n%9 = mul(%6, %8) f32[2, 6, 6]\n"
      "%10 = expand(%3) bool[2, 6, 6]\n%11 = scalar($1) f32[]\n"
      "%12 = expand(%11) f32[2, 6, 6]\n%13 = where(%10, %12, %9) f32[2, 6, 6]\n"
      "%14 = max(%13) {1, 2} f32[2, 6, 1]\n%15 = expand(%14) f32[2, 6, 6]\n"
      "%16 = sub(%13, %15) f32[2, 6, 6]\n%17 = exp(%16) f32[2, 6, 6]\n"
      "%18 = sum(%17) {1, 2} f32[2, 6, 1]\n%19 = expand(%18) f32[2, 6, 6]\n"
      "%20 = div(%17, %19) f32[2, 6, 6]\n%21 = mat_mul(%20, %2) f32[2, 6, 4]\n"
      "%22 = permute(%20) {0, 2, 1} f32[2, 6, 6]\n%23 = mat_mul(%22, %4) f32[2, 6, 4]\n"
      "%24 = permute(%2) {0, 2, 1} f32[2, 4, 6]\n%25 = mat_mul(%4, %24) f32[2, 6, 6]\n"
      "%26 = mul(%25, %20) f32[2, 6, 6]\n%27 = sum(%26) {1, 2} f32[2, 6, 1]\n"
      "%28 = expand(%27) f32[2, 6, 6]\n%29 = sub(%25, %28) f32[2, 6, 6]\n"
      "%30 = mul(%20, %29) f32[2, 6, 6]\n%31 = scalar($2) f32[]\n"
      "%32 = expand(%31) f32[2, 6, 6]\n%33 = where(%10, %32, %30) f32[2, 6, 6]\n"
      "%34 = mul(%33, %8) f32[2, 6, 6]\n%35 = permute(%0) {0, 2, 1} f32[2, 4, 6]\n"
      "%36 = mat_mul(%35, %34) f32[2, 4, 6]\n%37 = mat_mul(%34, %1) f32[2, 6, 4]\n"
      "return %21, %23, %36, %37\n";
  EXPECT_EQ(lines(run_until(graph, "drop_unread_steps"), "%"),
            "%21 attention f32[2, 6, 4] <- %0[2, 6, 4] %1[2, 6, 4] %2[2, 6, 4] %3[6, 6]  \n"
            "%37 attention_backward f32[2, 6, 4] <- %0[2, 6, 4] %1[2, 6, 4] %2[2, 6, 4] %3[6, 6] "
            "%14[2, 6, 1] %18[2, 6, 1] %4[2, 6, 4]  \n");
}

TEST(LowerPass, AMatmulReadsATransposeThroughStridesAndTheTransposeIsDropped) {
  const std::string graph =
      "%0 = data(#0) f32[8, 4]\n%1 = permute(%0) {1, 0} f32[4, 8]\n"
      "%2 = mat_mul(%1, %0) f32[4, 4]\nreturn %2\n";
  EXPECT_EQ(lines(run_until(graph, "lower"), "%"),
            "%1 permute f32[4, 8] <- %0[8, 4]  \n"
            "%2 mat_mul f32[4, 4] <- %0[8, 4] %0[8, 4]  \n");
  EXPECT_EQ(lines(run_until(graph, "drop_unread_steps"), "%"),
            "%2 mat_mul f32[4, 4] <- %0[8, 4] %0[8, 4]  \n");
}

TEST(LowerPass, ATransposeBehindLeadingOnesIsReadThroughStridesToo) {
  // A linear layer's transposed weight as [1, in, out] against a [B, T, in] batch, and the
  // input gradient's transpose of that: both products read the weight itself.
  const std::string graph =
      "%0 = data(#0) f32[6, 4]\n%1 = permute(%0) {1, 0} f32[4, 6]\n"
      "%2 = reshape(%1) f32[1, 4, 6]\n%3 = data(#1) f32[2, 3, 4]\n"
      "%4 = mat_mul(%3, %2) f32[2, 3, 6]\n%5 = permute(%2) {0, 2, 1} f32[1, 6, 4]\n"
      "%6 = mat_mul(%4, %5) f32[2, 3, 4]\nreturn %4, %6\n";
  EXPECT_EQ(lines(run_until(graph, "drop_unread_steps"), "%"),
            "%4 mat_mul f32[2, 3, 6] <- %3[2, 3, 4] %0[6, 4]  \n"
            "%6 mat_mul f32[2, 3, 4] <- %4[2, 3, 6] %0[6, 4]  \n");
}

TEST(ConvCopiesPass, AnInputTwoConvolutionsCopyIsCopiedOnce) {
  // The forward convolution and the weight gradient both copy x to oneDNN's layout: one copy,
  // written by the first, read by the second, in memory of its own.
  const std::string conv = kConv;
  const std::string graph =
      "%0 = data(#0) f32[2, 16, 8, 8]\n%1 = data(#1) f32[16, 16, 3, 3]\n"
      "%2 = data(#2) f32[2, 16, 8, 8]\n%3 = conv2d(%0, %1) " +
      conv + " f32[2, 16, 8, 8]\n%4 = conv2d_backward_weight(%0, %2) " + conv +
      " f32[16, 16, 3, 3]\nreturn %3, %4\n";
  EXPECT_EQ(run_until(graph, "add_checks").copies_bytes, 0u);
  const plan::Plan p = run_until(graph, "share_conv_copies");
  EXPECT_GT(p.copies_bytes, 0u);
  EXPECT_LE(p.copies_bytes, 2u * 16 * 8 * 8 * 4 * 2) << "one copy of x (padded at most twice)";
}

TEST(ConvAlgorithmPass, Big3x3ConvolutionsRunAsWinogradUnlessDirectIsAsked) {
  // 16 channels in and out, an 8x8 output: Winograd under the default rule, in all three
  // directions; a 1x1 kernel never; with set_conv_algo(Direct), none.
  const std::string conv = kConv;
  const std::string graph =
      "%0 = data(#0) f32[2, 16, 8, 8]\n%1 = data(#1) f32[16, 16, 3, 3]\n"
      "%2 = data(#2) f32[16, 16, 1, 1]\n%3 = conv2d(%0, %1) " +
      conv + " f32[2, 16, 8, 8]\n%4 = conv2d_backward_input(%3, %1) " + conv +
      " f32[2, 16, 8, 8]\n%5 = conv2d_backward_weight(%0, %3) " + conv +
      " f32[16, 16, 3, 3]\n%6 = conv2d(%0, %2) {1, 1, 0, 0, 1, 1, 1} "
      "f32[2, 16, 8, 8]\nreturn %4, %5, %6\n";
  EXPECT_EQ(lines(run_until(graph, "choose_conv_algorithms"), "node %"),
            "node %0 data f32[2, 16, 8, 8]\n"
            "node %1 data f32[16, 16, 3, 3]\n"
            "node %2 data f32[16, 16, 1, 1]\n"
            "node %3 conv2d f32[2, 16, 8, 8] nChw16c winograd\n"
            "node %4 conv2d_backward_input f32[2, 16, 8, 8] output winograd\n"
            "node %5 conv2d_backward_weight f32[16, 16, 3, 3] output winograd\n"
            "node %6 conv2d f32[2, 16, 8, 8] output\n");
  cpu::set_conv_algo(cpu::ConvAlgo::Direct);
  const std::string direct = lines(run_until(graph, "choose_conv_algorithms"), "node %");
  cpu::set_conv_algo(cpu::ConvAlgo::Auto);
  EXPECT_EQ(direct.find("winograd"), std::string::npos) << direct;
}

TEST(ConstantsPass, ARampIsFoldedAndWhatReadsItRunsAtRunTime) {
  // iota (an index ramp) times 2 is known at compile time: both are folded into the program's
  // constants; the add that reads an input stays a step and reads the kept copy.
  const plan::Plan p = run_until(
      "%0 = data(#0) i64[8]\n%1 = iota() {0} i64[8]\n%2 = add(%1, %1) i64[8]\n"
      "%3 = add(%2, %0) i64[8]\nreturn %3\n",
      "lower");
  EXPECT_EQ(lines(p, "node"),
            "node %0 data i64[8]\n"
            "node %1 iota i64[8] folded\n"
            "node %2 add i64[8] folded\n"
            "node %3 add i64[8] output\n");
  EXPECT_EQ(lines(p, "%"),
            "%2 constant i64[8] (folded)\n"
            "%3 add i64[8] <- %2[8] %0[8]  \n");
}

TEST(MergePass, ConsecutiveFusedStepsOfOneSizeRunAsAGroup) {
  // A momentum update then the parameter it moves: two trees, one group, tile by tile; the
  // second reads the first's output element for element.
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[8192]\n%1 = data(#1) f32[8192]\n%2 = data(#2) f32[8192]\n"
      "%3 = add(%0, %1) f32[8192]\n%4 = sub(%2, %3) f32[8192]\nreturn %3, %4\n",
      "merge_fused_steps");
  EXPECT_EQ(lines(p, "%"),
            "%3 fused_group f32[8192] <- %0[8192] %1[8192] %2[8192] %3[8192]  add(r0,r1)->r2 ; "
            "sub(r0,r1)->r2 \n");
}

TEST(MergePass, ASoftmaxRunsAsOneProgramOverItsRows) {
  // max, exp(x - max) summed, then divided by the sum: one step, exp(x - max) computed once.
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[64, 32]\n%1 = max(%0) {1, 1} f32[64, 1]\n%2 = expand(%1) f32[64, 32]\n"
      "%3 = sub(%0, %2) f32[64, 32]\n%4 = exp(%3) f32[64, 32]\n"
      "%5 = sum(%4) {1, 1} f32[64, 1]\n%6 = expand(%5) f32[64, 32]\n"
      "%7 = div(%4, %6) f32[64, 32]\nreturn %7\n",
      "merge_row_steps");
  EXPECT_EQ(lines(p, "%"),
            "%1 fused_rows f32[64, 1] <- %0[64, 32] %1[64, 1] %5[64, 1]  sub(r0,r1)->r2 "
            "exp(r2)->r3 div(r3,r4)->r5 \n");
  // A layer norm: the mean and the inverse deviation from the sums are trees over one value per
  // row, computed for each tile's rows between the reductions.
  const plan::Plan ln = run_until(
      "%0 = data(#0) f32[64, 32]\n%1 = sum(%0) {1, 1} f32[64, 1]\n%2 = scalar($0) f32[]\n"
      "%3 = div(%1, %2) f32[64, 1]\n%4 = expand(%3) f32[64, 32]\n%5 = sub(%0, %4) f32[64, 32]\n"
      "%6 = mul(%5, %5) f32[64, 32]\n%7 = sum(%6) {1, 1} f32[64, 1]\n"
      "%8 = div(%7, %2) f32[64, 1]\n%9 = rsqrt(%8) f32[64, 1]\n%10 = expand(%9) f32[64, 32]\n"
      "%11 = mul(%5, %10) f32[64, 32]\nreturn %11\n",
      "merge_row_steps");
  const std::string steps = lines(ln, "%");
  EXPECT_THAT(steps, testing::StartsWith("%2 scalar"));
  EXPECT_THAT(steps, testing::HasSubstr("\n%1 fused_rows f32[64, 1] <- %0[64, 32] %1[64, 1]"));
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 2) << steps;
  // Rows of up to FusedTree::kRowTile values (a layer norm over d 768 or 1024) are one program;
  // longer rows separate steps.
  auto max_sub = [](int64_t row) {
    const std::string r = std::to_string(row);
    return run_until("%0 = data(#0) f32[4, " + r + "]\n%1 = max(%0) {1, 1} f32[4, 1]\n" +
                         "%2 = expand(%1) f32[4, " + r + "]\n%3 = sub(%0, %2) f32[4, " + r +
                         "]\nreturn %3\n",
                     "merge_row_steps");
  };
  EXPECT_NE(lines(max_sub(cpu::FusedTree::kRowTile), "%").find("fused_rows"), std::string::npos);
  EXPECT_EQ(lines(max_sub(2 * cpu::FusedTree::kRowTile), "%").find("fused_rows"),
            std::string::npos);
}

// Two gradients (%3, then %6) that DataParallel averages (scale 0.5: the bits
// 4602678819172646912; orders 0 and 1; buckets of 1 KiB) and the updates that read them,
// recorded interleaved as the graph builder orders them (update of p1 before %6 is computed).
constexpr const char* kTwoGradients =
    "%0 = data(#0) f32[8]\n%1 = data(#1) f32[8]\n%2 = data(#2) f32[8]\n"
    "%3 = mul(%2, %2) f32[8]\n"
    "%4 = all_reduce(%3) {4602678819172646912, 0, 1024, 1024} f32[8]\n"
    "%5 = sub(%1, %4) f32[8]\n"
    "%6 = exp(%2) f32[8]\n"
    "%7 = all_reduce(%6) {4602678819172646912, 1, 1024, 1024} f32[8]\n"
    "%8 = sub(%0, %7) f32[8]\n";

TEST(BucketPass, GradientsShareABucketStartedAfterTheLastAndWaitedForBeforeTheUpdates) {
  const std::string graph = std::string(kTwoGradients) + "return %5, %8\n";
  // One bucket (64 bytes each, padded): started once %6 is computed; the update of p1 moves
  // behind the wait with the other.
  EXPECT_EQ(lines(run_until(graph, "bucket_all_reduces"), "%"),
            "%3 fused f32[8] <- %2[8]  mul(r0r0)->r1 \n"
            "%6 fused f32[8] <- %2[8]  exp(r0)->r1 \n"
            "%4 all_reduce_start f32[8] <- %3[8] %6[8]  all_reduce of bucket 1 (2 gradients, 128 "
            "bytes, 2 computed in place) recorded at unknown location\n"
            "%4 all_reduce_wait f32[8] <-  all_reduce of bucket 1 (2 gradients, 128 bytes, 2 "
            "computed in place) recorded at unknown location\n"
            "%5 fused f32[8] <- %1[8] %4[8]  sub(r0,r1)->r2 \n"
            "%8 fused f32[8] <- %0[8] %7[8]  sub(r0,r1)->r2 \n");
}

// Gradients are computed straight into their bucket's region, their sums are summed there in
// place and the updates read them there (the all-reduce outputs live in the region too); a
// gradient that something reads after its bucket starts (here %3, by %9) keeps its own memory
// and is copied in when the bucket starts.
TEST(BucketPass, GradientsLiveInTheirBucketsRegionUnlessReadAfterItStarts) {
  const std::string graph =
      std::string(kTwoGradients) + "%9 = add(%3, %7) f32[8]\nreturn %5, %8, %9\n";
  const plan::Plan p = run_until(graph, "plan_memory");
  EXPECT_THAT(lines(p, "%4 all_reduce_start"),
              ::testing::HasSubstr("(2 gradients, 128 bytes, 1 computed in place)"));
  EXPECT_THAT(lines(p, "node %6 "), ::testing::HasSubstr("slot region0@64"));
  EXPECT_THAT(lines(p, "node %7 "), ::testing::HasSubstr("slot region0@64"));
  EXPECT_THAT(lines(p, "node %4 "), ::testing::HasSubstr("slot region0@0"));
  EXPECT_THAT(lines(p, "node %3 "), ::testing::HasSubstr("slot arena@"));
  EXPECT_EQ(p.regions, (std::vector<size_t>{128}));
}

// Four gradients reduced to another rank (ZeroRedundancyOptimizer's stage 2: root 1; buckets of
// 64 bytes, one gradient each), then a broadcast ordered after the reduces (its operands before
// its value only order it). Each reduce is waited for before the one two after it starts (at
// most two in flight); the buckets' regions hold no output, so they live in the arena only from
// the first gradient computed there to their wait, and the broadcast's reads of the other rank's
// sums are dropped, so as not to keep them alive to the end.
TEST(BucketPass, ReducesToAnotherRankFreeTheirRegionAtTheirWait) {
  std::string graph = "%0 = data(#0) f32[8]\n%1 = data(#1) f32[]\n";
  const char* grads[] = {"exp", "tanh", "neg", "abs"};
  for (int k = 0; k < 4; ++k)
    graph += lockstep::util::cat("%", 2 + 2 * k, " = ", grads[k], "(%0) f32[8]\n%", 3 + 2 * k,
                                 " = all_reduce(%", 2 + 2 * k, ") {4607182418800017408, ", k,
                                 ", 64, 64, 1, 0} f32[8]\n");
  graph += "%10 = broadcast(%3, %5, %7, %9, %1) {0} f32[]\nreturn %10\n";
  const plan::Plan p = run_until(graph, "plan_memory");
  std::vector<std::string> order;
  for (const plan::Step& s : p.steps)
    if (std::string(s.label).find("all_reduce") == 0)
      order.push_back(std::string(s.label) + " %" + std::to_string(s.node));
  EXPECT_EQ(order, (std::vector<std::string>{"all_reduce_start %3", "all_reduce_start %5",
                                             "all_reduce_wait %3", "all_reduce_start %7",
                                             "all_reduce_wait %5", "all_reduce_start %9",
                                             "all_reduce_wait %7", "all_reduce_wait %9"}));
  ASSERT_EQ(p.regions.size(), 4u);
  for (int64_t at : p.region_at)
    EXPECT_GE(at, 0) << "a region that holds no output is in the arena";
  EXPECT_EQ(p.planned.outputs, 4u) << "the broadcast's value alone";
  for (const plan::Step& s : p.steps)
    if (std::string(s.label) == "broadcast_start") {
      EXPECT_EQ(s.reads, (std::vector<int32_t>{1}));
    }
  // The first bucket's region is free again before the fourth gradient is computed: the fourth
  // takes its memory.
  EXPECT_EQ(p.region_at[0], p.region_at[3]);
}

// ZeroRedundancyOptimizer's runs of a split gradient (elements 0-5 and 6-9 of %2, reduced to ranks
// 0 and 1; buckets of 16 bytes, which the first run alone fills): the runs share a bucket, side
// by side with no padding between, and the gradient is computed there, so nothing is copied in.
// Without that, the whole gradient lived in the arena besides its runs' copies in the buckets.
TEST(BucketPass, RunsOfOneGradientShareABucketWhereTheGradientIsComputed) {
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[10]\n%1 = data(#1) f32[]\n%2 = exp(%0) f32[10]\n"
      "%3 = slice(%2) {0, 0, 6, 1} f32[6]\n"
      "%4 = all_reduce(%3) {4607182418800017408, 0, 16, 16, 0, 0} f32[6]\n"
      "%5 = slice(%2) {0, 6, 10, 1} f32[4]\n"
      "%6 = all_reduce(%5) {4607182418800017408, 0, 16, 16, 1, 0} f32[4]\n"
      "%7 = broadcast(%4, %6, %1) {0} f32[]\nreturn %7\n",
      "plan_memory");
  EXPECT_THAT(lines(p, "%4 all_reduce_start"),
              ::testing::HasSubstr("(2 gradients, 64 bytes, 2 computed in place)"));
  EXPECT_EQ(p.regions, (std::vector<size_t>{64}));
  EXPECT_THAT(lines(p, "node %2 "), ::testing::HasSubstr("slot region0@0"));
  EXPECT_THAT(lines(p, "node %6 "), ::testing::HasSubstr("slot region0@24")) << "right after";
}

// A slice that is one run of its operand's memory (here time step 2 of [3, 4, 8], as an LSTM
// unbinds its input projections) lives there: an alias at its offset, nothing copied. A slice
// of the last axis (rows apart) is copied into memory of its own.
TEST(MemoryPass, AContiguousSliceLivesInItsOperandsMemory) {
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[3, 4, 8]\n%1 = data(#1) f32[8, 4]\n%2 = exp(%0) f32[3, 4, 8]\n"
      "%3 = slice(%2) {0, 2, 3, 1} f32[1, 4, 8]\n%4 = slice(%2) {2, 0, 4, 1} f32[3, 4, 4]\n"
      "%5 = reshape(%3) f32[4, 8]\n%6 = mat_mul(%5, %1) f32[4, 4]\n"
      "%7 = sum(%4) {0, 0} f32[4, 4]\n%8 = add(%6, %7) f32[4, 4]\nreturn %8\n",
      "plan_memory");
  ASSERT_EQ(p.slot[3].kind, plan::Slot::Alias);
  EXPECT_EQ(p.slot[3].index, 2);
  EXPECT_EQ(p.slot[3].offset, 2 * 4 * 8 * 4) << "bytes to time step 2";
  EXPECT_EQ(plan::slice_offset(p.graph, 4), -1);
  EXPECT_NE(p.slot[4].kind, plan::Slot::Alias);
  // The operand lives while the alias is read (through the reshape, by the product).
  EXPECT_EQ(plan::memory_roots(p)[3], 2);
  EXPECT_EQ(plan::memory_roots(p)[5], 2);
}

// The plan verifier (run between passes in debug builds and with LOCKSTEP_VERIFY_PLANS=1, which
// the tests set) passes every plan the pipeline makes and names the pass whose plan breaks an
// invariant.
TEST(PlanVerifier, AcceptsThePipelinesPlansAndNamesABrokenOne) {
  const std::string graph =
      "%0 = data(#0) f32[8, 8]\n%1 = mat_mul(%0, %0) f32[8, 8]\n%2 = exp(%1) f32[8, 8]\n"
      "return %2\n";
  plan::Plan p(ir::from_text(graph));
  for (const plan::Pass& pass : cpu::pipeline()) {
    pass.run(p);
    EXPECT_NO_THROW(plan::verify_plan(p, pass.name)) << pass.name;
  }
  ASSERT_GE(p.steps.size(), 2u);
  auto expect_broken = [](const plan::Plan& bad, const std::string& what) {
    try {
      plan::verify_plan(bad, "a test pass");
      ADD_FAILURE() << "accepted a plan where " << what;
    } catch (const lockstep::InternalError& e) {
      EXPECT_THAT(e.what(), testing::HasSubstr("plan invariant broken after a test pass: "));
      EXPECT_THAT(e.what(), testing::HasSubstr(what));
    }
  };
  plan::Plan reordered = p;  // the step that reads a value moved before the one that writes it
  std::reverse(reordered.steps.begin(), reordered.steps.end());
  expect_broken(reordered, "step 0 reads");
  plan::Plan twice = p;  // one value written by two steps
  twice.steps.push_back(twice.steps.back());
  expect_broken(twice, "is written by steps");
  plan::Plan short_decisions = p;
  short_decisions.absorbed.pop_back();
  expect_broken(short_decisions, "per-node decisions do not cover");
}

// Three sharded parameters' gathers (broadcasts with gather 1) of one size, each read by a
// product: as many start at once as twice the largest one's bytes allow (two), the third as soon
// as the first is waited for, so that it is in flight while the first product runs; each one's
// memory is taken from its start, so gathers in flight together do not share it.
TEST(GatherPass, GathersStartAsEarlyAsTheBytesInFlightAllow) {
  const std::string graph =
      "%0 = data(#0) f32[16, 16]\n%1 = data(#1) f32[16, 16]\n%2 = data(#2) f32[16, 16]\n"
      "%3 = broadcast(%1) {0, 1} f32[16, 16]\n%4 = mat_mul(%0, %3) f32[16, 16]\n"
      "%5 = broadcast(%2) {0, 1} f32[16, 16]\n%6 = mat_mul(%4, %5) f32[16, 16]\n"
      "%7 = broadcast(%0) {1, 1} f32[16, 16]\n%8 = mat_mul(%6, %7) f32[16, 16]\nreturn %8\n";
  const plan::Plan p = run_until(graph, "plan_memory");
  std::vector<std::string> order;
  for (const plan::Step& s : p.steps)
    order.push_back(std::string(s.label) + " %" + std::to_string(s.node));
  EXPECT_EQ(order, (std::vector<std::string>{"gather_start %3", "gather_start %5", "gather_wait %3",
                                             "gather_start %7", "mat_mul %4", "gather_wait %5",
                                             "mat_mul %6", "gather_wait %7", "mat_mul %8"}));
  for (const int id : {3, 5, 7}) ASSERT_EQ(p.slot[id].kind, plan::Slot::Arena) << id;
  EXPECT_NE(p.slot[3].index, p.slot[5].index) << "both live while %4 is computed";
  EXPECT_NE(p.slot[5].index, p.slot[7].index) << "both live while %6 is computed";
  EXPECT_NE(p.slot[3].index, p.slot[7].index) << "both live while %4 is computed";
  // Split parameters' gathers (each its runs' broadcasts, joined): the window is of whole
  // parameters, so the second parameter's runs are in flight while the first's are in use.
  const plan::Plan split = run_until(
      "%0 = data(#0) f32[4, 16]\n%1 = data(#1) f32[128]\n%2 = data(#2) f32[128]\n"
      "%3 = data(#3) f32[128]\n%4 = data(#4) f32[128]\n"
      "%5 = broadcast(%1) {0, 1} f32[128]\n%6 = broadcast(%2) {1, 1} f32[128]\n"
      "%7 = concat(%5, %6) {0} f32[256]\n%8 = reshape(%7) f32[16, 16]\n"
      "%9 = mat_mul(%0, %8) f32[4, 16]\n"
      "%10 = broadcast(%3) {0, 1} f32[128]\n%11 = broadcast(%4) {1, 1} f32[128]\n"
      "%12 = concat(%10, %11) {0} f32[256]\n%13 = reshape(%12) f32[16, 16]\n"
      "%14 = mat_mul(%9, %13) f32[4, 16]\nreturn %14\n",
      "plan_memory");
  std::vector<std::string> steps;
  for (const plan::Step& s : split.steps)
    steps.push_back(std::string(s.label) + " %" + std::to_string(s.node));
  ASSERT_GE(steps.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(steps.begin(), steps.begin() + 5),
            (std::vector<std::string>{"gather_start %5", "gather_start %6", "gather_start %10",
                                      "gather_start %11", "gather_wait %5"}));
  // A plain broadcast stays one blocking step.
  const plan::Plan q = run_until(
      "%0 = data(#0) f32[4]\n%1 = broadcast(%0) {0} f32[4]\n%2 = exp(%1) f32[4]\nreturn %2\n",
      "plan_memory");
  for (const plan::Step& s : q.steps)
    EXPECT_EQ(std::string(s.label).find("gather"), std::string::npos);
}

// ZeroRedundancyOptimizer's join of a split parameter (its runs broadcast one after the other, the
// second ordered after the first, concatenated and reshaped into the parameter's new value): each
// broadcast receives into its place in one region, which holds the concatenation and the output
// too, so nothing is copied and the runs are held once. A broadcast something else reads keeps
// memory of its own.
TEST(JoinPass, BroadcastsReceiveStraightIntoTheirConcatenation) {
  const std::string head =
      "%0 = data(#0) f32[6]\n%1 = data(#1) f32[10]\n%2 = broadcast(%0) {0} f32[6]\n"
      "%3 = broadcast(%2, %1) {1} f32[10]\n%4 = concat(%2, %3) {0} f32[16]\n"
      "%5 = reshape(%4) f32[4, 4]\n";
  const plan::Plan p = run_until(head + "return %5\n", "plan_memory");
  for (const int id : {2, 3, 4, 5}) ASSERT_EQ(p.slot[id].kind, plan::Slot::Region) << id;
  EXPECT_EQ(p.slot[3].region, p.slot[2].region);
  EXPECT_EQ(p.slot[4].region, p.slot[2].region);
  EXPECT_EQ(p.slot[5].region, p.slot[2].region);
  EXPECT_EQ(p.slot[2].index, 0);
  EXPECT_EQ(p.slot[3].index, 6 * 4);  // after the first run's bytes
  EXPECT_EQ(p.slot[5].index, 0);
  EXPECT_EQ(p.arena_bytes, 0u) << "nothing held besides the output";
  const plan::Plan q = run_until(head + "%6 = exp(%2) f32[6]\nreturn %5, %6\n", "plan_memory");
  EXPECT_EQ(q.slot[2].kind, plan::Slot::Arena);
  EXPECT_EQ(q.slot[4].kind, plan::Slot::Arena);
  EXPECT_EQ(q.slot[5].kind, plan::Slot::Output);
  // A split parameter's gather (fully_shard: the runs' gathers, started ahead of their use by
  // prefetch_gathers) receives into its concatenation too, a region of the arena.
  const plan::Plan r = run_until(
      "%0 = data(#0) f32[6]\n%1 = data(#1) f32[10]\n%2 = broadcast(%0) {0, 1} f32[6]\n"
      "%3 = broadcast(%1) {1, 1} f32[10]\n%4 = concat(%2, %3) {0} f32[16]\n"
      "%5 = reshape(%4) f32[4, 4]\n%6 = exp(%5) f32[4, 4]\nreturn %6\n",
      "plan_memory");
  for (const int id : {2, 3, 4}) ASSERT_EQ(r.slot[id].kind, plan::Slot::Region) << id;
  EXPECT_EQ(r.slot[3].region, r.slot[2].region);
  EXPECT_EQ(r.slot[4].region, r.slot[2].region);
  EXPECT_EQ(r.slot[3].index, 6 * 4);
  EXPECT_GE(r.region_at[r.slot[2].region], 0) << "in the arena";
  int starts = 0;
  for (const plan::Step& s : r.steps) starts += std::string(s.label) == "gather_start";
  EXPECT_EQ(starts, 2);
}

// The step's plain broadcasts (ZeroRedundancyOptimizer's, one after another: the second ordered
// after the first) start where they were, in their order, and are waited for just before their
// first readers, so they are in flight together; the second's start does not wait for the first
// (its read of it only ordered it). A split parameter's runs, joined, are both in flight before
// the concatenation.
TEST(BroadcastPass, BroadcastsAreInFlightTogetherUntilTheirFirstReaders) {
  const plan::Plan p = run_until(
      "%0 = data(#0) f32[6]\n%1 = data(#1) f32[10]\n%2 = broadcast(%0) {0} f32[6]\n"
      "%3 = broadcast(%2, %1) {1} f32[10]\n%4 = exp(%2) f32[6]\n%5 = exp(%3) f32[10]\n"
      "return %4, %5\n",
      "plan_memory");
  std::vector<std::string> order;
  for (const plan::Step& s : p.steps) {
    order.push_back(std::string(s.label) + " %" + std::to_string(s.node));
    if (std::string(s.label) == "broadcast_start" && s.node == 3) {
      EXPECT_EQ(s.reads, (std::vector<int32_t>{1})) << "not the first broadcast's value";
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"broadcast_start %2", "broadcast_start %3",
                                             "broadcast_wait %2", "fused %4", "broadcast_wait %3",
                                             "fused %5"}));
  const plan::Plan joined = run_until(
      "%0 = data(#0) f32[6]\n%1 = data(#1) f32[10]\n%2 = broadcast(%0) {0} f32[6]\n"
      "%3 = broadcast(%2, %1) {1} f32[10]\n%4 = concat(%2, %3) {0} f32[16]\n"
      "%5 = reshape(%4) f32[4, 4]\nreturn %5\n",
      "plan_memory");
  order.clear();
  for (const plan::Step& s : joined.steps)
    order.push_back(std::string(s.label) + " %" + std::to_string(s.node));
  ASSERT_GE(order.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 5),
            (std::vector<std::string>{"broadcast_start %2", "broadcast_start %3",
                                      "broadcast_wait %2", "broadcast_wait %3", "concat %4"}));
}

// An LSTM layer and its gradient in one program: the gradient reads the workspace the forward
// pass left in a region of the arena (live between the two steps) instead of running the forward
// pass again. With the forward pass's value an input (computed by an earlier program) it has no
// workspace to read and recomputes it.
TEST(LstmPass, TheGradientReadsItsForwardPassesWorkspace) {
  const std::string operands =
      "%0 = data(#0) f32[3, 2, 4]\n%1 = data(#1) f32[2, 3]\n%2 = data(#2) f32[2, 3]\n"
      "%3 = data(#3) f32[12, 4]\n%4 = data(#4) f32[12, 3]\n%5 = data(#5) f32[12]\n";
  auto step_of = [](const plan::Plan& p, const char* label) -> const plan::Step* {
    for (const plan::Step& s : p.steps)
      if (std::string(s.label) == label) return &s;
    return nullptr;
  };
  const plan::Plan p = run_until(operands +
                                     "%6 = lstm(%0, %1, %2, %3, %4, %5) {1} f32[5, 2, 3]\n"
                                     "%7 = data(#6) f32[5, 2, 3]\n"
                                     "%8 = lstm_backward(%0, %1, %2, %3, %4, %5, %6, %7) {1} "
                                     "f32[132]\nreturn %8\n",
                                 "plan_memory");
  const plan::Step* fwd = step_of(p, "lstm");
  const plan::Step* bwd = step_of(p, "lstm_backward");
  ASSERT_TRUE(fwd && bwd);
  ASSERT_GE(fwd->region, 0);
  EXPECT_EQ(bwd->region, fwd->region);
  EXPECT_GT(p.regions[fwd->region], 0u);
  EXPECT_GE(p.region_at[fwd->region], 0) << "the workspace lives in the arena";
  const plan::Plan alone = run_until(operands +
                                         "%6 = data(#6) f32[5, 2, 3]\n%7 = data(#7) f32[5, 2, 3]\n"
                                         "%8 = lstm_backward(%0, %1, %2, %3, %4, %5, %6, %7) {1} "
                                         "f32[132]\nreturn %8\n",
                                     "plan_memory");
  ASSERT_TRUE(step_of(alone, "lstm_backward"));
  EXPECT_EQ(step_of(alone, "lstm_backward")->region, -1);
}
