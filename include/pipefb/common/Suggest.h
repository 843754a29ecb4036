#pragma once
// "Did you mean" hints for misspelt keys and names.
#include <string>
#include <vector>

namespace pipefb {

/// The candidate closest to `word` by edit distance, or "" when none is close
/// (distance more than a third of the word's length, at least 2).
std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates);

/// " (did you mean 'x'?)" or "".
std::string didYouMean(const std::string& word, const std::vector<std::string>& candidates);

/// "a | b | c"
std::string joinAllowed(const std::vector<std::string>& names);

}  // namespace pipefb
