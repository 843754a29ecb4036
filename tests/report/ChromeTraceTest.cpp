#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipefb/report/ChromeTrace.h"

namespace pipefb::report {
namespace {

using nlohmann::json;

json writeAndRead(const ChromeTrace& t) {
  const std::string path = std::string(PIPEFB_BINARY_DIR) + "/chrome_trace_test.json";
  t.write(path, {{"schedule", "none"}});
  std::ifstream f(path);
  return json::parse(f);
}

TEST(ChromeTraceTest, ProcessesSpansAndCountersInChromeFormat) {
  ChromeTrace t(1'000'000);  // ts = 0 at 1 ms
  t.addProcess(0, "cpu:0");
  t.addThread(0, 0, "compute");
  t.addSpan(0, 0, "1F0", "F", 2'000'000, 2'500'000, {{"stage", 0}});
  CategoryBytes b{};
  b[index(MemoryCategory::Stash)] = 4096;
  t.addMemoryCounter(0, "memory", 2'500'000, b);
  json j = writeAndRead(t);
  ASSERT_TRUE(j["traceEvents"].is_array());
  EXPECT_EQ(j["otherData"]["schedule"], "none");
  int meta = 0, spans = 0, counters = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") ++meta;
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1000.0);  // microseconds since the origin
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 500.0);
      EXPECT_EQ(e["cat"], "F");
    }
    if (e["ph"] == "C") {
      ++counters;
      EXPECT_EQ(e["args"]["stash"], 4096);
      EXPECT_EQ(e["args"]["weights"], 0);
      EXPECT_EQ(e["args"].size(), kNumMemoryCategories);
    }
  }
  EXPECT_EQ(meta, 3);  // process_name, process_sort_index, thread_name
  EXPECT_EQ(spans, 1);
  EXPECT_EQ(counters, 1);
}

TEST(ChromeTraceTest, ReplaysEventsFromTheBaseAndSkipsUnknownDomains) {
  ChromeTrace t(0);
  using memory::MemoryEvent;
  using memory::MemoryEventKind;
  std::vector<MemoryEvent> ev;
  auto e = [](int64_t ns, int64_t bytes, int dom, MemoryEventKind k, MemoryCategory c) {
    MemoryEvent x;
    x.time_ns = ns;
    x.bytes = bytes;
    x.domain = dom;
    x.kind = k;
    x.category = c;
    return x;
  };
  ev.push_back(e(10, 100, 7, MemoryEventKind::Alloc, MemoryCategory::Stash));
  ev.push_back(e(20, 999, 8, MemoryEventKind::Alloc, MemoryCategory::Stash));  // not a device
  ev.push_back(e(30, 50, 7, MemoryEventKind::Free, MemoryCategory::Stash));
  ev.push_back(e(40, 10, 7, MemoryEventKind::Oom, MemoryCategory::Stash));  // refused: no change
  CategoryBytes base{};
  base[index(MemoryCategory::Weights)] = 1000;
  t.addMemoryEvents(ev, {{7, base}}, {{7, 3}});
  json j = writeAndRead(t);
  std::vector<std::pair<int64_t, int64_t>> seen;  // (stash, weights)
  for (const auto& x : j["traceEvents"]) {
    ASSERT_EQ(x["ph"], "C");
    EXPECT_EQ(x["pid"], 3);
    EXPECT_EQ(x["name"], "memory events");
    seen.push_back({x["args"]["stash"].get<int64_t>(), x["args"]["weights"].get<int64_t>()});
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], std::make_pair(int64_t{100}, int64_t{1000}));
  EXPECT_EQ(seen[1], std::make_pair(int64_t{50}, int64_t{1000}));
  EXPECT_EQ(seen[2], std::make_pair(int64_t{50}, int64_t{1000}));
}

}  // namespace
}  // namespace pipefb::report
