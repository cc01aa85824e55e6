// Variable-length batches: padding to bucket lengths (one compile per bucket, not per length)
// and the padding masks attention takes.
#include <algorithm>

#include "lockstep/nn.h"
#include "util/check.h"

namespace lockstep::nn {

using util::cat;

namespace {

Tensor mask_of(const std::vector<int64_t>& lengths, int64_t length, Device device) {
  std::vector<bool> pad;
  for (int64_t n : lengths)
    for (int64_t i = 0; i < length; ++i) pad.push_back(i >= n);
  std::vector<unsigned char> bytes(pad.begin(), pad.end());
  return from_blob(bytes.data(), {static_cast<int64_t>(lengths.size()), length}, DType::Bool,
                   device);
}

}  // namespace

int64_t bucket_length(int64_t length, const std::vector<int64_t>& buckets) {
  if (buckets.empty()) throw Error("bucket_length: no buckets given; pass e.g. {32, 64, 128}");
  if (!std::is_sorted(buckets.begin(), buckets.end()) || buckets.front() <= 0)
    throw Error(
        cat("bucket_length: buckets ", shape_str(buckets), " must be positive and ascending"));
  for (int64_t b : buckets)
    if (b >= length) return b;
  throw Error(cat("bucket_length: a sequence of length ", length,
                  " is longer than the last bucket ", buckets.back(),
                  ". Add a larger bucket, or truncate the sequence"));
}

PaddedSequences pad_sequences(const std::vector<Tensor>& seqs, int64_t length, bool batch_first,
                              Scalar padding_value, Loc loc) {
  if (seqs.empty())
    util::fail(loc, "pad_sequences", "got no sequences", "Pass at least one tensor");
  std::vector<int64_t> lengths;
  int64_t longest = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Tensor& s = seqs[i];
    if (!s.defined() || s.dim() < 1)
      util::fail(loc, "pad_sequences", cat("sequence ", i, " is empty or 0-d"),
                 "Each sequence needs a leading length axis [L, ...]");
    if (s.dtype() != seqs[0].dtype() ||
        !std::equal(s.shape().begin() + 1, s.shape().end(), seqs[0].shape().begin() + 1,
                    seqs[0].shape().end()))
      util::fail(
          loc, "pad_sequences",
          cat("sequence ", i, " is ", dtype_name(s.dtype()), shape_str(s.shape()),
              " but sequence 0 is ", dtype_name(seqs[0].dtype()), shape_str(seqs[0].shape())),
          "All sequences need the same dtype and trailing shape");
    lengths.push_back(s.size(0));
    longest = std::max(longest, s.size(0));
  }
  const int64_t l = length == 0 ? longest : length;
  if (l < longest)
    util::fail(loc, "pad_sequences",
               cat("length ", length, " is shorter than the longest ", longest),
               "Pass 0 (the longest) or a length >= every sequence (e.g. from bucket_length)");
  std::vector<Tensor> padded;
  for (const Tensor& s : seqs) {
    std::vector<std::pair<int64_t, int64_t>> p(static_cast<size_t>(s.dim()), {0, 0});
    p[0].second = l - s.size(0);
    padded.push_back(p[0].second ? pad(s, p, padding_value, loc) : s);
  }
  Tensor out = stack(padded, batch_first ? 0 : 1, loc);
  return {out, mask_of(lengths, l, seqs[0].device()), lengths};
}

PaddedSequences pad_token_batch(const std::vector<std::vector<int64_t>>& tokens,
                                const std::vector<int64_t>& buckets, int64_t pad_id, Device device,
                                Loc loc) {
  if (tokens.empty())
    util::fail(loc, "pad_token_batch", "got no token lists", "Pass at least one sequence");
  std::vector<int64_t> lengths;
  int64_t longest = 0;
  for (const auto& t : tokens) {
    lengths.push_back(static_cast<int64_t>(t.size()));
    longest = std::max(longest, lengths.back());
  }
  const int64_t l = bucket_length(std::max<int64_t>(longest, 1), buckets);
  std::vector<int64_t> flat;
  flat.reserve(tokens.size() * static_cast<size_t>(l));
  for (const auto& t : tokens) {
    flat.insert(flat.end(), t.begin(), t.end());
    flat.insert(flat.end(), static_cast<size_t>(l) - t.size(), pad_id);
  }
  return {from_vector(flat, {static_cast<int64_t>(tokens.size()), l}, device, loc),
          mask_of(lengths, l, device), lengths};
}

}  // namespace lockstep::nn
