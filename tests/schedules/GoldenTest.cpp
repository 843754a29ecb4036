// Golden schedules: small shapes, lowered, checked in as text (tests/schedules/golden/).
// Regenerate after an intended change with PIPEFB_UPDATE_GOLDEN=1 and review the diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "pipefb/schedules/Generators.h"
#include "pipefb/schedules/Lowering.h"
#include "pipefb/schedules/Validator.h"

using namespace pipefb::schedules;

namespace {

struct Golden {
  std::string kind;
  int S, M, K;
  StashPolicy policy;
  int lookahead;
  std::string file() const {
    return kind + "_S" + std::to_string(S) + "_M" + std::to_string(M) + "_K" + std::to_string(K) +
           "_" + toString(policy) + "_L" + std::to_string(lookahead) + ".txt";
  }
};

const std::vector<Golden> kGoldens = {
    {"gpipe", 3, 2, 1, StashPolicy::Keep, 1},
    {"1f1b", 3, 4, 1, StashPolicy::Keep, 1},
    {"1f1b", 2, 3, 1, StashPolicy::CheckpointOffload, 1},
    {"pipedream", 3, 2, 2, StashPolicy::Keep, 1},
    {"pipefb-sync", 2, 3, 2, StashPolicy::Offload, 1},
    {"pipefb-async", 2, 2, 3, StashPolicy::Offload, 1},
    {"pipefb-sync", 3, 2, 1, StashPolicy::Checkpoint, 0},
    // Note [Weight-version offload]: OFFW/PREW/DROPW.
    {"pipedream", 3, 2, 2, StashPolicy::Offload, 1},
    {"pipedream", 3, 4, 2, StashPolicy::CheckpointOffload, 2},
    {"pipefb-async", 2, 2, 3, StashPolicy::CheckpointOffload, 1},
    // Note [Split backward]: I and W; several stages per device.
    {"zb-h1", 3, 4, 1, StashPolicy::Keep, 1},
    {"zb-h2", 3, 5, 2, StashPolicy::Offload, 1},
    {"zbv", 4, 3, 1, StashPolicy::Keep, 1},
    {"interleaved-1f1b", 4, 4, 1, StashPolicy::CheckpointOffload, 1},
    {"pipefb-zb", 2, 3, 2, StashPolicy::Offload, 1},
};

std::string goldenDir() { return std::string(PIPEFB_SOURCE_DIR) + "/tests/schedules/golden/"; }

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(GoldenTest, GeneratedSchedulesMatchCheckedInText) {
  const bool update = std::getenv("PIPEFB_UPDATE_GOLDEN") != nullptr;
  for (const Golden& g : kGoldens) {
    SchedulePlan plan = lower(makeSchedule(g.kind, g.S, g.M, g.K), {g.policy}, g.lookahead);
    std::string text = toText(plan.schedule);
    std::string path = goldenDir() + g.file();
    if (update) {
      std::ofstream(path) << text;
      continue;
    }
    std::string want = readFile(path);
    ASSERT_FALSE(want.empty()) << "missing golden file " << path
                               << " (run with PIPEFB_UPDATE_GOLDEN=1 to create it)";
    EXPECT_EQ(text, want) << g.file();
    // The checked-in text parses back to the same schedule, which is valid.
    Schedule parsed = loadSchedule(path);
    EXPECT_EQ(parsed, plan.schedule) << g.file();
    EXPECT_NO_THROW(validate(parsed, &plan.contract)) << g.file();
  }
}
