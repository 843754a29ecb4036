#include "pipefb/common/Size.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace pipefb {

std::optional<int64_t> parseSize(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t numStart = i;
  bool sawDigit = false, sawDot = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    if (text[i] == '.') {
      if (sawDot) return std::nullopt;
      sawDot = true;
    } else {
      sawDigit = true;
    }
    ++i;
  }
  if (!sawDigit) return std::nullopt;
  double value = std::stod(text.substr(numStart, i - numStart));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  for (; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) return std::nullopt;
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "kib" || unit == "k")
    mult = 1024.0;
  else if (unit == "mib" || unit == "m")
    mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "tb")
    mult = 1e12;
  else
    return std::nullopt;
  double bytes = value * mult;
  if (!std::isfinite(bytes) || bytes > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(std::llround(bytes));
}

std::string formatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%s%lld B", bytes < 0 ? "-" : "", static_cast<long long>(v));
  else
    std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

}  // namespace pipefb
