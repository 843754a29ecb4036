// libFuzzer target: the config parser (pipefb::config::parseConfig).
// Input: YAML text, optionally followed by a NUL byte and `section.key=value` override
// lines (what --set passes). Bad input must give UserError; a config that parses must
// survive toYaml -> parseConfig unchanged (Config.h promises parseConfig(toYaml(c)) == c).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "FuzzUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/config/Config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipefb;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    std::istringstream rest(input.substr(nul + 1));
    for (std::string line; std::getline(rest, line);) overrides.push_back(line);
  }
  config::Config c;
  try {
    c = config::parseConfig(yaml, overrides, "<fuzz>");
  } catch (const UserError&) {
    return 0;  // bad input, reported the way a person sees it
  }
  const std::string once = config::toYaml(c);
  config::Config back;
  try {
    back = config::parseConfig(once, {}, "<fuzz>");
  } catch (const UserError& e) {
    fuzz::fail(std::string("toYaml output does not parse back: ") + e.what() + "\n" + once);
  }
  if (config::toYaml(back) != once)
    fuzz::fail("toYaml -> parseConfig -> toYaml changed the config:\n" + once + "---\n" +
               config::toYaml(back));
  return 0;
}
