// libFuzzer target: plan files (pipefb::planner::parsePlan, what pipefb_train --plan
// reads). Bad input must give UserError; a plan that parses must satisfy what parsePlan
// promises (contiguous non-empty stages covering [0, layers), batch = M x microbatch size).
#include <cstddef>
#include <cstdint>
#include <string>

#include "FuzzUtil.h"
#include "pipefb/common/Error.h"
#include "pipefb/planner/PlanFile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipefb;
  const std::string text(reinterpret_cast<const char*>(data), size);
  planner::PlanSpec p;
  try {
    p = planner::parsePlan(text, "<fuzz>");
  } catch (const UserError&) {
    return 0;
  }
  int expect = 0;
  for (const auto& st : p.stages) {
    if (st.first != expect || st.last <= st.first)
      fuzz::fail("parsePlan accepted a gap or empty stage");
    expect = st.last;
  }
  if (expect != p.numLayers) fuzz::fail("parsePlan accepted stages that do not cover the layers");
  if (p.microbatches < 1 || p.batch != p.microbatches * p.microbatchSize)
    fuzz::fail("parsePlan accepted a batch that is not microbatches x microbatch_size");
  if (p.partition().size() + 1 != p.stages.size() && !p.stages.empty())
    fuzz::fail("partition() size does not match the stages");
  return 0;
}
