// The per-example transforms (normalize, random crop, random horizontal flip) on host data.
// Not batch-level or device-side augmentation.
#include <utility>

#include "lockstep/data.h"
#include "util/check.h"

namespace lockstep::data {

using util::cat;

namespace {

constexpr uint64_t kTransformTag = 0x5452414e53464f52ull;  // "TRANSFOR"

void check_chw(const Example& ex, const char* op) {
  if (ex.shape.size() != 3)
    throw Error(cat(op, ": example of shape ", shape_str(ex.shape),
                    " is not (C, H, W); transforms work on 3-d images"));
  if (static_cast<int64_t>(ex.image.size()) != shape_numel(ex.shape))
    throw Error(cat(op, ": example holds ", ex.image.size(), " values but its shape ",
                    shape_str(ex.shape), " needs ", shape_numel(ex.shape)));
}

class Normalize : public Transform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> std)
      : mean_(std::move(mean)), std_(std::move(std)) {
    if (mean_.empty() || std_.empty())
      throw Error("normalize: mean and std need one value per channel (or one for all)");
    for (float s : std_)
      if (!(s > 0)) throw Error(cat("normalize: std ", s, " is not positive"));
  }
  void apply(Example& ex, Rng&) const override {
    check_chw(ex, "normalize");
    const int64_t c = ex.shape[0];
    for (const auto* v : {&mean_, &std_})
      if (v->size() != 1 && static_cast<int64_t>(v->size()) != c)
        throw Error(cat("normalize: ", v->size(), " ", v == &mean_ ? "means" : "stds",
                        " for an example with ", c, " channels; give one per channel or one"));
    const int64_t plane = ex.shape[1] * ex.shape[2];
    for (int64_t ch = 0; ch < c; ++ch) {
      const float m = mean_[mean_.size() == 1 ? 0 : static_cast<size_t>(ch)];
      const float inv = 1.0f / std_[std_.size() == 1 ? 0 : static_cast<size_t>(ch)];
      float* p = ex.image.data() + ch * plane;
      for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) * inv;
    }
  }

 private:
  std::vector<float> mean_, std_;
};

class RandomCrop : public Transform {
 public:
  RandomCrop(int64_t size, int64_t padding) : size_(size), padding_(padding) {
    if (size_ <= 0) throw Error(cat("random_crop: size ", size_, " must be positive"));
    if (padding_ < 0) throw Error(cat("random_crop: padding ", padding_, " must not be negative"));
  }
  void apply(Example& ex, Rng& rng) const override {
    check_chw(ex, "random_crop");
    const int64_t c = ex.shape[0], h = ex.shape[1], w = ex.shape[2];
    if (h + 2 * padding_ < size_ || w + 2 * padding_ < size_)
      throw Error(cat("random_crop: a ", size_, "x", size_, " window does not fit an image of ", h,
                      "x", w, " padded by ", padding_, "; use a smaller size or more padding"));
    // Window origin in padded coordinates, then shifted back into the image's.
    const int64_t top = static_cast<int64_t>(rng.below(h + 2 * padding_ - size_ + 1)) - padding_;
    const int64_t left = static_cast<int64_t>(rng.below(w + 2 * padding_ - size_ + 1)) - padding_;
    std::vector<float> out(static_cast<size_t>(c * size_ * size_), 0.0f);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < size_; ++y) {
        const int64_t sy = top + y;
        if (sy < 0 || sy >= h) continue;
        for (int64_t x = 0; x < size_; ++x) {
          const int64_t sx = left + x;
          if (sx < 0 || sx >= w) continue;
          out[static_cast<size_t>((ch * size_ + y) * size_ + x)] =
              ex.image[static_cast<size_t>((ch * h + sy) * w + sx)];
        }
      }
    ex.image = std::move(out);
    ex.shape = {c, size_, size_};
  }

 private:
  int64_t size_, padding_;
};

class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p) : p_(p) {
    if (!(p_ >= 0 && p_ <= 1))
      throw Error(cat("random_horizontal_flip: probability ", p_, " is not in [0, 1]"));
  }
  void apply(Example& ex, Rng& rng) const override {
    check_chw(ex, "random_horizontal_flip");
    if (!(rng.uniform() < p_)) return;
    const int64_t rows = ex.shape[0] * ex.shape[1], w = ex.shape[2];
    for (int64_t r = 0; r < rows; ++r) {
      float* row = ex.image.data() + r * w;
      for (int64_t a = 0, b = w - 1; a < b; ++a, --b) std::swap(row[a], row[b]);
    }
  }

 private:
  double p_;
};

}  // namespace

std::shared_ptr<const Transform> normalize(std::vector<float> mean, std::vector<float> std) {
  return std::make_shared<Normalize>(std::move(mean), std::move(std));
}

std::shared_ptr<const Transform> random_crop(int64_t size, int64_t padding) {
  return std::make_shared<RandomCrop>(size, padding);
}

std::shared_ptr<const Transform> random_horizontal_flip(double p) {
  return std::make_shared<RandomHorizontalFlip>(p);
}

void apply_transforms(Example& example, const TransformList& transforms, uint64_t seed,
                      int64_t epoch, int64_t index) {
  if (transforms.empty()) return;
  Rng rng(
      Rng::mix({seed, kTransformTag, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)}));
  for (const auto& t : transforms) t->apply(example, rng);
}

}  // namespace lockstep::data
