#include "pipefb/common/Error.h"

namespace pipefb::detail {

void throwInternal(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal error (a pipefb bug): " << msg << " [" << cond << " at " << file << ":" << line
     << "]";
  throw InternalError(os.str());
}

}  // namespace pipefb::detail
