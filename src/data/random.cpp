// data::Rng, the small portable generator behind shuffling, fake data and augmentation.
// Not the tensor random numbers (ls::rand and friends live in the runtime, as tensors).
#include "lockstep/data.h"

namespace lockstep::data {

namespace {
uint64_t splitmix(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t Rng::mix(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x243f6a8885a308d3ull ^ values.size();
  for (uint64_t v : values) {
    uint64_t s = h ^ v;
    h = splitmix(s);
  }
  return h;
}

uint64_t Rng::next() { return splitmix(state_); }

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t Rng::below(uint64_t n) {
  // Lemire's multiply-shift; the bias (at most n / 2^64) is far below anything observable.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

}  // namespace lockstep::data
