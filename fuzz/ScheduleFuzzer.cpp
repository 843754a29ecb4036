// libFuzzer target: the schedule text form (pipefb::schedules::parseSchedule, Note
// [Schedule text form]) and the validator that pipefb_sim --load runs on it.
// Bad input must give UserError (ScheduleError is one); a schedule that parses must
// print and parse back equal.
#include <cstddef>
#include <cstdint>
#include <string>

#include "FuzzUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/schedules/Schedule.h"
#include "pipefb/schedules/Validator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipefb;
  const std::string text(reinterpret_cast<const char*>(data), size);
  schedules::Schedule s;
  try {
    s = schedules::parseSchedule(text, "<fuzz>");
  } catch (const UserError&) {
    return 0;
  }
  const std::string printed = schedules::toText(s);
  schedules::Schedule back;
  try {
    back = schedules::parseSchedule(printed, "<fuzz:printed>");
  } catch (const UserError& e) {
    fuzz::fail(std::string("toText output does not parse back: ") + e.what() + "\n" + printed);
  }
  if (!(back == s)) fuzz::fail("toText -> parseSchedule changed the schedule:\n" + printed);
  // The validator runs every schedule pipefb_sim --load reads. Its abstract run is
  // linear in the actions; the cap keeps one fuzz input fast, not correctness.
  if (s.numActions() <= 4096 && s.numDevices() <= 256) {
    try {
      schedules::validate(s);
    } catch (const UserError&) {
    }
  }
  return 0;
}
