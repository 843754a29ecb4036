#pragma once
// Self-contained, portable randomness for the data component (private header).
//
// Data order and synthetic samples must not depend on torch's global RNG (which
// model initialisation consumes) nor on the standard library's distributions
// (whose algorithms differ between implementations). So we seed std::mt19937_64,
// whose output sequence the standard fixes, through splitmix64, and draw bounded
// integers by rejection.
#include <cstdint>
#include <random>

namespace pipefb::data::detail {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A seed derived from (a, b); different b give unrelated streams.
inline uint64_t mixSeed(uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(a) ^ (b * 0xD6E8FEB86659FD93ull));
}

/// Uniform integer in [0, n), n > 0, without modulo bias.
inline uint64_t uniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % n);  // largest multiple of n
  uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % n;
}

}  // namespace pipefb::data::detail
