#pragma once
// Shared by the libFuzzer targets (fuzz/README.md). The contract every target checks:
// bad input gives pipefb::UserError; anything else escaping the parser (another
// exception, InternalError from PIPEFB_ASSERT, a crash, a sanitizer report) is a bug.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pipefb::fuzz {

/// A property the target checks failed: print it and abort so libFuzzer saves the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace pipefb::fuzz
