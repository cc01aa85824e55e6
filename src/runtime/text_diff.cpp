// ls::debug::diff: a unified diff of two texts (graph dumps), line by line: the common prefix and
// suffix are set aside, the rest is aligned by a longest common subsequence, and the changed
// regions are printed with two lines of context.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/runtime.h"
#include "util/check.h"

namespace lockstep::debug {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t eol = text.find('\n', at);
    out.push_back(text.substr(at, eol == std::string::npos ? std::string::npos : eol - at));
    if (eol == std::string::npos) break;
    at = eol + 1;
  }
  return out;
}

// An edit script line: ' ' kept, '-' only in a, '+' only in b, with its line numbers.
struct Edit {
  char kind;
  size_t a, b;  // 0-based positions (of the next line on the side it does not belong to)
};

}  // namespace

std::string diff(const std::string& a_text, const std::string& b_text) {
  const std::vector<std::string> a = split(a_text), b = split(b_text);
  size_t pre = 0;
  while (pre < a.size() && pre < b.size() && a[pre] == b[pre]) ++pre;
  size_t suf = 0;
  while (suf < a.size() - pre && suf < b.size() - pre &&
         a[a.size() - 1 - suf] == b[b.size() - 1 - suf])
    ++suf;
  const size_t n = a.size() - pre - suf, m = b.size() - pre - suf;
  std::vector<Edit> edits;
  for (size_t i = 0; i < pre; ++i) edits.push_back({' ', i, i});
  // The middle: a longest common subsequence when it is small enough, else all replaced.
  constexpr size_t kMaxCells = size_t{16} << 20;
  if (n > 0 && m > 0 && (n + 1) * (m + 1) <= kMaxCells) {
    std::vector<uint32_t> len((n + 1) * (m + 1), 0);  // LCS of a[i..], b[j..]
    auto at = [&](size_t i, size_t j) -> uint32_t& { return len[i * (m + 1) + j]; };
    for (size_t i = n; i-- > 0;)
      for (size_t j = m; j-- > 0;)
        at(i, j) =
            a[pre + i] == b[pre + j] ? at(i + 1, j + 1) + 1 : std::max(at(i + 1, j), at(i, j + 1));
    size_t i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[pre + i] == b[pre + j]) {
        edits.push_back({' ', pre + i++, pre + j++});
      } else if (i < n && (j == m || at(i + 1, j) >= at(i, j + 1))) {
        edits.push_back({'-', pre + i++, pre + j});
      } else {
        edits.push_back({'+', pre + i, pre + j++});
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) edits.push_back({'-', pre + i, pre});
    for (size_t j = 0; j < m; ++j) edits.push_back({'+', pre + n, pre + j});
  }
  for (size_t k = 0; k < suf; ++k) edits.push_back({' ', pre + n + k, pre + m + k});

  // Hunks: the changed lines with two lines of context around them.
  constexpr size_t kContext = 2;
  std::string out;
  size_t e = 0;
  while (e < edits.size()) {
    if (edits[e].kind == ' ') {
      ++e;
      continue;
    }
    size_t begin = e >= kContext ? e - kContext : 0;
    while (begin < e && edits[begin].kind != ' ') ++begin;
    size_t end = e;  // past the hunk
    size_t quiet = 0;
    while (end < edits.size() && quiet <= 2 * kContext) {
      quiet = edits[end].kind == ' ' ? quiet + 1 : 0;
      ++end;
    }
    end -= quiet > kContext ? quiet - kContext : 0;
    size_t a_count = 0, b_count = 0;
    for (size_t k = begin; k < end; ++k) {
      a_count += edits[k].kind != '+';
      b_count += edits[k].kind != '-';
    }
    out += util::cat("@@ -", edits[begin].a + 1, ",", a_count, " +", edits[begin].b + 1, ",",
                     b_count, " @@\n");
    for (size_t k = begin; k < end; ++k) {
      const Edit& x = edits[k];
      out += x.kind;
      out += x.kind == '+' ? b[x.b] : a[x.a];
      out += '\n';
    }
    e = end;
  }
  return out;
}

}  // namespace lockstep::debug
