// einsum, written from primitives: each operand's repeated-free labels summed away where no
// other term needs them, pairs of terms contracted by matmul, the result permuted into the
// output's order. Its checks name the equation and what in it is wrong.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "tensor/frontend.h"
#include "util/check.h"

namespace lockstep {

using util::cat;

namespace {

struct Term {
  Tensor t;
  std::string labels;  // one char per axis
};

[[noreturn]] void einsum_fail(const Loc& loc, const std::string& eq, const std::string& what,
                              const std::string& fix) {
  util::fail(loc, "einsum", cat("\"", eq, "\": ", what), fix);
}

// Sums away the labels of `t` not in `keep`.
Term sum_out(Term t, const std::string& keep, const Loc& loc) {
  std::vector<int64_t> axes;
  std::string rest;
  for (size_t i = 0; i < t.labels.size(); ++i)
    if (keep.find(t.labels[i]) == std::string::npos)
      axes.push_back(static_cast<int64_t>(i));
    else
      rest += t.labels[i];
  if (axes.empty()) return t;
  return {sum(t.t, axes, false, loc), rest};
}

Term permuted(const Term& t, const std::string& order, const Loc& loc) {
  std::vector<int64_t> perm;
  for (char c : order) perm.push_back(static_cast<int64_t>(t.labels.find(c)));
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i)
    identity = identity && perm[i] == static_cast<int64_t>(i);
  return {identity ? t.t : permute(t.t, perm, loc), order};
}

// a x b over their shared labels; the result keeps the labels in `keep`.
Term contract(Term a, Term b, const std::string& keep, const Loc& loc) {
  auto has = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  std::string keep_a = keep + b.labels, keep_b = keep + a.labels;
  a = sum_out(a, keep_a, loc);
  b = sum_out(b, keep_b, loc);
  std::string batch, left, right, inner;
  for (char c : a.labels)
    if (has(b.labels, c))
      (has(keep, c) ? batch : inner) += c;
    else
      left += c;
  for (char c : b.labels)
    if (!has(a.labels, c)) right += c;
  const Term pa = permuted(a, batch + left + inner, loc);
  const Term pb = permuted(b, batch + inner + right, loc);
  auto size_of = [&](const Term& t, char c) { return t.t.shape()[t.labels.find(c)]; };
  Shape sa, sb, out;
  int64_t l = 1, r = 1, k = 1;
  for (char c : batch) {
    sa.push_back(size_of(pa, c));
    sb.push_back(size_of(pb, c));
    out.push_back(std::max(size_of(pa, c), size_of(pb, c)));
  }
  for (char c : left) {
    l *= size_of(pa, c);
    out.push_back(size_of(pa, c));
  }
  for (char c : inner) k *= size_of(pa, c);
  for (char c : right) {
    r *= size_of(pb, c);
    out.push_back(size_of(pb, c));
  }
  sa.insert(sa.end(), {l, k});
  sb.insert(sb.end(), {k, r});
  const Tensor y = matmul(reshape(pa.t, sa, loc), reshape(pb.t, sb, loc), loc);
  return {reshape(y, out, loc), batch + left + right};
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands, Loc loc) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> specs;
  for (size_t at = 0;;) {
    const size_t comma = lhs.find(',', at);
    specs.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (specs.size() != operands.size())
    einsum_fail(loc, equation,
                cat(specs.size(), " operand specs for ", operands.size(), " tensors"),
                "Give one comma-separated spec per operand");
  // "..." stands for the same leading run of broadcast axes in every operand; it becomes labels
  // '0', '1', ... (aligned from the right, as broadcasting aligns).
  int64_t ellipsis_rank = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t dots = specs[i].find("...");
    const int64_t r = operands[i].dim();
    const int64_t named =
        static_cast<int64_t>(specs[i].size()) - (dots == std::string::npos ? 0 : 3);
    if (dots != std::string::npos) ellipsis_rank = std::max(ellipsis_rank, r - named);
  }
  if (ellipsis_rank > 10)
    einsum_fail(loc, equation, "more than 10 axes under \"...\"", "Reshape the operands first");
  auto expand_dots = [&](const std::string& s, int64_t n) {
    const size_t dots = s.find("...");
    if (dots == std::string::npos) return s;
    std::string e;
    for (int64_t j = ellipsis_rank - n; j < ellipsis_rank; ++j) e += static_cast<char>('0' + j);
    return s.substr(0, dots) + e + s.substr(dots + 3);
  };
  std::vector<Term> terms;
  std::map<char, int64_t> sizes, counts;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& s = specs[i];
    const bool has_dots = s.find("...") != std::string::npos;
    const int64_t named = static_cast<int64_t>(s.size()) - (has_dots ? 3 : 0);
    const int64_t r = operands[i].dim();
    if ((!has_dots && named != r) || (has_dots && named > r))
      einsum_fail(loc, equation,
                  cat("operand ", i, " has shape ", shape_str(operands[i].shape()), " but spec \"",
                      s, "\" names ", named, " axes"),
                  "Give one letter per axis (or \"...\" for leading ones)");
    const std::string labels = expand_dots(s, r - named);
    const size_t dots = s.find("...");
    for (size_t j = 0; j < s.size(); ++j)
      if (!std::isalpha(static_cast<unsigned char>(s[j])) &&
          !(dots != std::string::npos && j >= dots && j < dots + 3))
        einsum_fail(loc, equation, cat("'", s[j], "' in \"", s, "\" is not a letter"),
                    "Label axes with a-z, A-Z (and \"...\" once for leading axes)");
    for (size_t j = 0; j < labels.size(); ++j) {
      const char c = labels[j];
      if (labels.find(c) != j)
        einsum_fail(loc, equation, cat("label '", c, "' repeats within operand ", i),
                    "Diagonals are not supported: take them with a mask first");
      const int64_t d = operands[i].shape()[j];
      auto [it, fresh] = sizes.emplace(c, d);
      if (!fresh && it->second != d) {
        if (std::isalpha(static_cast<unsigned char>(c)) || (it->second != 1 && d != 1))
          einsum_fail(loc, equation, cat("label '", c, "' has size ", it->second, " and ", d),
                      "An axis label must have one size in every operand");
        it->second = std::max(it->second, d);
      }
      ++counts[c];
    }
    terms.push_back({operands[i], labels});
  }
  std::string out;
  if (arrow == std::string::npos) {
    // Implicit output: the broadcast axes, then the labels used once, alphabetically.
    for (int64_t j = 0; j < ellipsis_rank; ++j) out += static_cast<char>('0' + j);
    for (const auto& [c, n] : counts)
      if (n == 1 && std::isalpha(static_cast<unsigned char>(c))) out += c;
  } else {
    const std::string rhs = eq.substr(arrow + 2);
    out = rhs.find("...") == std::string::npos ? rhs : expand_dots(rhs, ellipsis_rank);
    for (size_t j = 0; j < out.size(); ++j) {
      if (!sizes.count(out[j]))
        einsum_fail(loc, equation, cat("output label '", out[j], "' names no input axis"),
                    "Use only labels of the operands on the right of ->");
      if (out.find(out[j]) != j)
        einsum_fail(loc, equation, cat("output label '", out[j], "' repeats"),
                    "Name each output axis once");
    }
  }
  Term acc = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) {
    std::string keep = out;
    for (size_t j = i + 1; j < terms.size(); ++j) keep += terms[j].labels;
    acc = contract(acc, terms[i], keep, loc);
  }
  acc = sum_out(acc, out, loc);
  // Broadcast axes of size 1 in a lone operand stretch to the size the others gave them.
  Shape want;
  for (char c : acc.labels) want.push_back(sizes[c]);
  if (acc.t.shape() != want) acc.t = expand(acc.t, want, loc);
  const Tensor y = permuted(acc, out, loc).t;
  return y.is_same(operands[0]) ? clone(y, loc) : y;
}

}  // namespace lockstep
