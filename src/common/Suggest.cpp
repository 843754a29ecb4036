#include "pipefb/common/Suggest.h"

#include <algorithm>
#include <cctype>

namespace pipefb {

namespace {
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t bestDist = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = editDistance(word, c);
    if (d < bestDist) {
      bestDist = d;
      best = c;
    }
  }
  size_t limit = std::max<size_t>(2, word.size() / 3);
  if (bestDist <= limit) return best;
  // A shortened or lengthened key ("lrate" for "lr", "micro" for "microbatches").
  std::string prefixed;
  for (const auto& c : candidates) {
    const auto& shorter = c.size() < word.size() ? c : word;
    const auto& longer = c.size() < word.size() ? word : c;
    if (shorter.size() >= 2 && longer.compare(0, shorter.size(), shorter) == 0 &&
        c.size() > prefixed.size())
      prefixed = c;
  }
  return prefixed;
}

std::string didYouMean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string m = closestMatch(word, candidates);
  return m.empty() ? std::string() : " (did you mean '" + m + "'?)";
}

std::string joinAllowed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? " | " : "") + names[i];
  return out;
}

}  // namespace pipefb
