// The ranks' agreement before a program with collectives runs (see comm.h): the program's
// replicated part and its hash, exchanged on the recording threads' communicator, with the first
// difference named; and barrier, max_on_all_ranks and check_same_on_all_ranks on the same
// exchange. Not the collectives themselves (comm_collectives.cpp) nor the world (comm.cpp).
#include <algorithm>
#include <bit>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/comm_world.h"
#include "ir/attrs.h"
#include "ir/random_bits.h"
#include "lockstep/dist.h"
#include "runtime/explain.h"
#include "util/check.h"

namespace lockstep::dist {

using util::cat;

namespace detail {

std::shared_ptr<const Agreement> agreement_of(const ir::Graph& graph, const std::string& setting) {
  const size_t n = graph.nodes.size();
  // What the broadcasts' roots compute for themselves: a node that feeds a broadcast's operand
  // and no other collective. Only the root's operand counts, so it may differ from rank to rank
  // (under ZeroRedundancyOptimizer each rank updates its own parameters and broadcasts them; with
  // DataParallel's broadcast_buffers, rank 0's running statistics): it is left out, and the
  // broadcast reads a stand-in of its shape and dtype.
  // A broadcast's value is its last operand (those before it only order it). So are the shares a
  // `local` all-reduce sums (each rank's over the parameters it owns, under ZeRO stage 2): they
  // differ from rank to rank in what they are computed from, not only in value.
  auto is_value = [](const ir::GraphNode& node, size_t k) {
    if (node.origin.rank_local) return true;
    if (node.op == ir::Op::AllReduce) return ir::AllReduceAttrs::of(node.attrs).local;
    return node.op == ir::Op::Broadcast && k + 1 == node.operands.size();
  };
  std::vector<char> to_broadcast(n, 0), to_other(n, 0), local(n, 0);
  for (size_t j = n; j-- > 0;) {
    const ir::GraphNode& node = graph.nodes[j];
    for (size_t k = 0; k < node.operands.size(); ++k) {
      const int32_t o = node.operands[k];
      if (is_value(node, k)) {  // what the root sends, whatever the broadcast's result feeds
        to_broadcast[o] = 1;
        continue;
      }
      to_broadcast[o] |= to_broadcast[j];
      to_other[o] |= to_other[j] || ir::is_collective(node.op);
    }
  }
  // And what one rank records for itself alone (ir::RankLocal: a ZeRO-3 owner's update of its
  // parameters), with what only that reads.
  for (size_t i = 0; i < n; ++i)
    local[i] = ((to_broadcast[i] && !to_other[i]) || graph.nodes[i].origin.rank_local) &&
               !ir::is_collective(graph.nodes[i].op);
  // Nodes are in topological order: first what reads a collective's result (transitively),
  // then, backwards, everything those and the collectives read.
  std::vector<char> in(n, 0);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const ir::GraphNode& node = graph.nodes[i];
    in[i] = ir::is_collective(node.op);
    any = any || in[i];
    if (!local[i])
      for (int32_t o : node.operands) in[i] = in[i] || in[o];
  }
  if (!any) return nullptr;
  // A broadcast's value is the root's: every rank's part reads a stand-in for it.
  for (size_t i = n; i-- > 0;)
    if (in[i])
      for (size_t k = 0; k < graph.nodes[i].operands.size(); ++k)
        if (const int32_t o = graph.nodes[i].operands[k]; !local[o] && !is_value(graph.nodes[i], k))
          in[o] = 1;
  auto out = std::make_shared<Agreement>();
  auto part = std::make_shared<ir::Graph>();
  part->device = graph.device;
  std::vector<int32_t> id(n, -1);
  std::vector<char> read(n, 0);
  uint64_t h = 0x6c6f636b73746570ull;
  auto mix = [&h](uint64_t v) { h = ir::mix64(h ^ v); };
  auto mix_node = [&mix](const ir::GraphNode& node) {
    mix(static_cast<uint64_t>(node.op) << 8 | static_cast<uint64_t>(node.dtype));
    mix(node.shape.size());
    for (int64_t d : node.shape) mix(static_cast<uint64_t>(d));
    mix(node.attrs.size());
    for (int64_t a : node.attrs) mix(static_cast<uint64_t>(a));
    mix(node.operands.size());
    for (int32_t o : node.operands) mix(static_cast<uint64_t>(o));
    mix(static_cast<uint64_t>(static_cast<int64_t>(node.input)));
  };
  for (size_t i = 0; i < n; ++i) {
    if (!in[i]) continue;
    ir::GraphNode node = graph.nodes[i];
    for (size_t k = 0; k < node.operands.size(); ++k) {
      int32_t& o = node.operands[k];
      read[o] = 1;
      if (id[o] < 0 || is_value(graph.nodes[i], k)) {  // a stand-in of its shape and dtype
        ir::GraphNode stand_in;
        stand_in.op = ir::Op::Data;
        stand_in.shape = graph.nodes[o].shape;
        stand_in.dtype = graph.nodes[o].dtype;
        stand_in.input = part->num_buffer_inputs++;
        stand_in.origin = graph.nodes[o].origin;
        mix_node(stand_in);
        o = static_cast<int32_t>(part->nodes.size());
        part->nodes.push_back(std::move(stand_in));
        continue;
      }
      o = id[o];
    }
    if (node.op == ir::Op::Data) node.input = part->num_buffer_inputs++;
    if (node.op == ir::Op::Scalar) {
      out->scalars.push_back(node.input);
      node.input = part->num_scalar_inputs++;
    }
    mix_node(node);
    id[i] = static_cast<int32_t>(part->nodes.size());
    part->nodes.push_back(std::move(node));
  }
  for (size_t i = 0; i < n; ++i)
    if (in[i] && !read[i]) part->outputs.push_back(id[i]);
  out->hash = ir::mix64(h ^ std::hash<std::string>{}(setting));
  out->graph = std::move(part);
  out->setting = setting;
  return out;
}

#if LOCKSTEP_WITH_MPI
namespace {

struct Record {
  uint64_t hash = 0;
  int64_t round = 0;
  int64_t nodes = 0;
  int64_t kind = 0;      // what the exchange is for: agreement 1, barrier 2, values 3, maximum 4
  uint64_t scalars = 0;  // agreement: a hash of the program's host scalar values
};

// Waits for `swap`'s messages until the deadline, then for its sends (received, so they
// complete). Past the deadline the world is broken, `buffers` kept until exit (MPI may still
// write them), and the Error names the ranks whose message never came, and `cause`: what may
// hold them.
void finish_swap(Swap& swap, std::shared_ptr<void> buffers, const std::string& what,
                 const char* cause) {
  World& w = world();
  if (!poll_until([&] { return swap.test(true, what); }, Clock::now() + timeout())) {
    keep_until_exit(std::move(buffers));
    if (w.broken.load()) throw_broken();
    const std::string why = cat(ranks_text(swap.missing()), " did not reach ", what, " within ",
                                seconds(timeout()), " (rank ", w.rank, " of ", w.size, " waited)");
    break_world(why);
    throw Error(cat("dist: ", why, ": ", cause, ". ", kAfterDeadline));
  }
  check(MPI_Waitall(static_cast<int>(swap.send.size()), swap.send.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall", what);
}

// Sends `mine` to every other rank and receives theirs (point to point on the recording threads'
// communicator, so that the ranks that never send are known). Throws Error naming the ranks
// that did not arrive before the deadline (the world is then broken).
std::vector<Record> exchange(const Record& mine, const std::string& what) {
  World& w = world();
  if (w.broken.load()) throw_broken();
  struct Buffers {
    std::vector<Record> in, out;
  };
  auto buf = std::make_shared<Buffers>();
  buf->in.assign(static_cast<size_t>(w.size), Record{});
  buf->out.assign(static_cast<size_t>(w.size), mine);
  buf->in[static_cast<size_t>(w.rank)] = mine;
  Swap swap(reinterpret_cast<char*>(buf->in.data()), reinterpret_cast<const char*>(buf->out.data()),
            sizeof(Record), 11, w.control, what);
  finish_swap(swap, buf, what, "they are stuck, dead, or running a different program");
  return buf->in;
}

// Every other rank's text (each rank sends its own to all: used only on a mismatch).
std::vector<std::string> exchange_texts(const std::string& mine, const std::string& what) {
  World& w = world();
  auto text = std::make_shared<std::string>(mine);
  std::vector<MPI_Request> send;
  for (int r = 0; r < w.size; ++r) {
    if (r == w.rank) continue;
    MPI_Request q;
    check(MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, r, 12, w.control, &q),
          "MPI_Isend", what);
    send.push_back(q);
  }
  std::vector<std::string> all(static_cast<size_t>(w.size));
  all[static_cast<size_t>(w.rank)] = mine;
  const auto deadline = Clock::now() + timeout();
  for (int r = 0; r < w.size; ++r) {
    if (r == w.rank) continue;
    MPI_Status st;
    int flag = 0;
    const bool ok = poll_until(
        [&] {
          check(MPI_Iprobe(r, 12, w.control, &flag, &st), "MPI_Iprobe", what);
          return flag != 0;
        },
        deadline);
    if (!ok) {
      keep_until_exit(text);
      all[static_cast<size_t>(r)] = "(did not arrive)";
      continue;
    }
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    all[static_cast<size_t>(r)].resize(static_cast<size_t>(count));
    check(MPI_Recv(all[static_cast<size_t>(r)].data(), count, MPI_CHAR, r, 12, w.control,
                   MPI_STATUS_IGNORE),
          "MPI_Recv", what);
  }
  MPI_Waitall(static_cast<int>(send.size()), send.data(), MPI_STATUSES_IGNORE);
  return all;
}

// The line of node `id` in a graph's annotated text ("%12 = add(...) ...  # file:line").
std::string node_line(const std::string& text, int64_t id) {
  const std::string key = cat("%", id, " = ");
  size_t at = 0;
  if (text.compare(0, key.size(), key) != 0) {
    at = text.find("\n" + key);
    if (at == std::string::npos) return "(no such node)";
    ++at;
  }
  const size_t eol = text.find('\n', at);
  return text.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
}

std::string hex(uint64_t h) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace
#endif

void agree(const Agreement& agreement, const std::string& origin,
           const std::vector<ir::ScalarValue>& all_scalars) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  std::lock_guard<std::mutex> lock(w.control_mu);
  const ir::Graph& graph = *agreement.graph;
  const uint64_t hash = agreement.hash;
  const std::string& setting = agreement.setting;
  std::vector<ir::ScalarValue> scalars;  // the replicated part's
  scalars.reserve(agreement.scalars.size());
  for (int32_t k : agreement.scalars) scalars.push_back(all_scalars[static_cast<size_t>(k)]);
  Record mine;
  mine.hash = hash;
  mine.round = ++w.rounds;
  mine.nodes = static_cast<int64_t>(graph.nodes.size());
  mine.kind = 1;
  mine.scalars = 1469598103934665603ull;
  for (const ir::ScalarValue& v : scalars) {
    mine.scalars = ir::mix64(mine.scalars ^ std::bit_cast<uint64_t>(v.f));
    mine.scalars = ir::mix64(mine.scalars ^ static_cast<uint64_t>(v.i));
  }
  const std::string what = cat(origin, " (program #", mine.round, " with collectives)");
  const std::vector<Record> all = detail::exchange(mine, what);
  bool same = true, all_here = true, same_scalars = true;
  for (const Record& r : all) {
    same = same && r.hash == hash && r.round == mine.round && r.kind == 1;
    all_here = all_here && r.kind == 1;
    same_scalars = same_scalars && r.scalars == mine.scalars;
  }
  if (same && same_scalars) return;
  if (same) {  // one program, other host values: which scalar, and the values
    std::string values;
    for (const ir::ScalarValue& v : scalars) values += cat(v.f, " ", v.i, "\n");
    const std::vector<std::string> theirs = exchange_texts(values, what);
    int other = 0;
    for (int r = 0; r < w.size; ++r)
      if (all[static_cast<size_t>(r)].scalars != mine.scalars) {
        other = r;
        break;
      }
    std::string where = "a host scalar";
    std::istringstream in(theirs[static_cast<size_t>(other)]);
    for (size_t k = 0; k < scalars.size(); ++k) {
      double f = 0;
      int64_t i = 0;
      in >> f >> i;
      if (f == scalars[k].f && i == scalars[k].i) continue;
      for (const ir::GraphNode& n : graph.nodes)
        if (n.op == ir::Op::Scalar && n.input == static_cast<int64_t>(k)) {
          const bool integral = !is_floating(n.dtype);
          where = cat("the host scalar made at ", util::where(n.origin.loc), ": rank ", other,
                      " has ", integral ? cat(i) : cat(f), ", rank ", w.rank, " has ",
                      integral ? cat(scalars[k].i) : cat(scalars[k].f));
          break;
        }
      break;
    }
    throw Error(cat("dist: the ranks are about to run the same program at ", what,
                    " with other host values: ", where,
                    ". A hyper-parameter (an lr, a weight decay, a loss scale) that differs "
                    "between the ranks trains different models: give every rank the same value "
                    "(a value that must differ per rank goes in a tensor). Nothing of this "
                    "program ran"));
  }
  // Different programs: every rank sees every record, so all of them fail here, before any
  // collective of the program is entered. The texts say where the graphs part.
  const std::string text = ir::to_text(graph, true);
  std::string holders;
  for (int r = 0; r < w.size; ++r) {
    const Record& rec = all[static_cast<size_t>(r)];
    holders +=
        cat(r ? "; " : "", "rank ", r, ": graph ", hex(rec.hash), " (", rec.nodes, " nodes",
            rec.kind != 1 ? ", at a barrier or value check instead" : "",
            rec.round != mine.round ? cat(", its program #", rec.round) : std::string(), ")");
  }
  // Against rank 0 (rank 0 against the first rank that differs).
  int other = 0;
  if (w.rank == 0 || all[0].hash == hash)
    for (int r = 0; r < w.size; ++r)
      if (all[static_cast<size_t>(r)].hash != hash) {
        other = r;
        break;
      }
  std::string where, other_setting;
  if (!all_here) {
    where = ". Some ranks are at a barrier or a value check instead of this program";
  } else
    try {
      const std::vector<std::string> texts = exchange_texts(text, what);
      const ir::Graph theirs = ir::from_text(texts[static_cast<size_t>(other)]);
      const runtime::GraphDifference d = runtime::difference(theirs, graph);
      if (d.node >= 0) {
        where = cat(". First difference (", d.field, "), node %", d.node, ": rank ", other,
                    " has `", node_line(texts[static_cast<size_t>(other)], d.node), "`, rank ",
                    w.rank, " has `", node_line(text, d.node), "`");
      } else {  // the same graph compiled for other settings: the thread count
        other_setting = exchange_texts(setting, what)[static_cast<size_t>(other)];
      }
    } catch (const Error&) {
      where = cat(". Rank ", other, "'s graph could not be compared");
    }
  if (!other_setting.empty())
    throw Error(cat("dist: the ranks are about to run the same graph at ", what,
                    " compiled for other backend settings: rank ", other, " has '", other_setting,
                    "', rank ", w.rank, " has '", setting,
                    "'. Give every rank the same thread count (OMP_NUM_THREADS, "
                    "ls::set_num_threads): a program's reductions follow it, so replicas would "
                    "drift apart. Nothing of this program ran"));
  throw Error(cat("dist: the ranks are about to run different programs at ", what, ": ", holders,
                  where,
                  ". Every rank must record the same ops on the same shapes (the same batch "
                  "size on every rank: drop_last, or pad) in the same order, for everything the "
                  "collectives read and everything that reads their results (a value kept for "
                  "logging on one rank only is free to differ if it is computed before the "
                  "collectives: compute one from their results on every rank). Nothing of this "
                  "program ran"));
#else
  (void)agreement, (void)origin, (void)all_scalars;
#endif
}

}  // namespace detail

void barrier() {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  std::lock_guard<std::mutex> lock(w.control_mu);
  detail::Record mine;
  mine.kind = 2;
  mine.round = w.rounds;
  const std::vector<detail::Record> all = detail::exchange(mine, "a barrier");
  std::vector<int> elsewhere;
  for (int r = 0; r < w.size; ++r)
    if (all[static_cast<size_t>(r)].kind != 2) elsewhere.push_back(r);
  if (!elsewhere.empty())
    throw Error(cat("dist: rank ", w.rank, " is at a barrier while ", ranks_text(elsewhere),
                    " run a program with collectives or check values: every rank must call "
                    "barrier() at the same point"));
#endif
}

namespace detail {

void save_barrier(const std::string& what) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  if (w.broken.load()) throw_broken();
  auto buf = std::make_shared<std::vector<char>>(2 * static_cast<size_t>(w.size), 0);
  Swap swap(buf->data(), buf->data() + w.size, 1, 31, w.saves, what);
  finish_swap(swap, buf, what, "they are stuck or dead, or their files take longer to write");
#else
  (void)what;
#endif
}

}  // namespace detail

int64_t max_on_all_ranks(int64_t value, const std::string& what) {
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return value;
  std::lock_guard<std::mutex> lock(w.control_mu);
  detail::Record mine;
  mine.kind = 4;
  mine.hash = static_cast<uint64_t>(value);
  mine.round = w.rounds;
  const std::vector<detail::Record> all = detail::exchange(mine, cat("the agreement on ", what));
  std::vector<int> elsewhere;
  int64_t most = value;
  for (int r = 0; r < w.size; ++r) {
    const detail::Record& rec = all[static_cast<size_t>(r)];
    if (rec.kind != 4)
      elsewhere.push_back(r);
    else
      most = std::max(most, static_cast<int64_t>(rec.hash));
  }
  if (!elsewhere.empty())
    throw Error(cat("dist: rank ", w.rank, " is at the agreement on ", what, " while ",
                    ranks_text(elsewhere),
                    " run a program with collectives, a barrier or a value check: every rank "
                    "must call max_on_all_ranks at the same point"));
  return most;
#else
  (void)what;
  return value;
#endif
}

void check_same_on_all_ranks(const std::vector<Tensor>& tensors, const std::string& what, Loc loc) {
  const uint64_t h = hash_values(tensors, loc);
#if LOCKSTEP_WITH_MPI
  World& w = world();
  if (w.size <= 1) return;
  std::lock_guard<std::mutex> lock(w.control_mu);
  detail::Record mine;
  mine.kind = 3;
  mine.hash = h;
  mine.round = w.rounds;
  const std::vector<detail::Record> all =
      detail::exchange(mine, cat("the check of ", what, " at ", util::where(loc)));
  std::vector<int> differ;
  std::string hashes;
  for (int r = 0; r < w.size; ++r) {
    const detail::Record& rec = all[static_cast<size_t>(r)];
    if (rec.kind != 3 || rec.hash != all[0].hash) differ.push_back(r);
    hashes += cat(r ? ", " : "", "rank ", r, ": ",
                  rec.kind == 3 ? detail::hex(rec.hash) : std::string("(elsewhere)"));
  }
  if (!differ.empty())
    throw Error(cat("dist: ", what, " differ between the ranks at ", util::where(loc), ": ",
                    ranks_text(differ), " hold other values than rank 0 (hashes: ", hashes,
                    "). Load the same checkpoint on every rank, or build the model through "
                    "dist::DataParallel, which takes rank 0's values"));
#else
  (void)h, (void)what;  // one rank: nothing to compare with
#endif
}

}  // namespace lockstep::dist
