#pragma once
// Two error channels (see STYLE.md, habit 9):
//  * UserError: bad input from a person (config, flag, file). Programs print its
//    one-line message and exit with code 2.
//  * PIPEFB_ASSERT: a bug in pipefb. It throws InternalError with the location.
#include <sstream>
#include <stdexcept>
#include <string>

namespace pipefb {

/// Bad user input. what() is one line: it names the key or file, what it got and
/// what is allowed.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

/// A violated internal invariant: a bug, never the user's fault.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

namespace detail {
[[noreturn]] void throwInternal(const char* cond, const char* file, int line,
                                const std::string& msg);
}  // namespace detail

}  // namespace pipefb

#define PIPEFB_ASSERT(cond, msg)                                                           \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::ostringstream pipefb_assert_os_;                                                \
      pipefb_assert_os_ << msg;                                                            \
      ::pipefb::detail::throwInternal(#cond, __FILE__, __LINE__, pipefb_assert_os_.str()); \
    }                                                                                      \
  } while (0)
