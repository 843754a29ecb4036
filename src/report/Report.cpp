#include "pipefb/report/Report.h"

#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/MemoryCategory.h"

namespace pipefb::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
using Bytes = std::array<int64_t, kNumMemoryCategories>;

int64_t total(const Bytes& b) {
  int64_t t = 0;
  for (int64_t v : b) t += v;
  return t;
}

std::string readFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void writeFile(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  if (!f) throw UserError("cannot write " + p.string());
}

std::string escapeHtml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

/// Bytes for people: MiB, or KiB below 1 MiB (tiny models would show 0.00 MiB).
std::string fmtMiB(int64_t bytes) {
  char buf[64];
  if (bytes != 0 && std::llabs(bytes) < (int64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / kMiB);
  return buf;
}

std::string fmt(double v, const char* f = "%.3f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// "cpu:0" -> "cpu0": a file-name-safe device name.
std::string fileSafe(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') out += c;
  return out.empty() ? "device" : out;
}

Bytes bytesFromJson(const json& j) {
  Bytes b{};
  if (!j.is_object()) return b;
  for (MemoryCategory c : kAllMemoryCategories)
    if (j.contains(toString(c)) && j[toString(c)].is_number())
      b[index(c)] = j[toString(c)].get<int64_t>();
  return b;
}

json bytesToJson(const Bytes& b) {
  json j = json::object();
  for (MemoryCategory c : kAllMemoryCategories) j[toString(c)] = b[index(c)];
  return j;
}

// ------------------------------------------------------------------ inputs

struct Sample {
  double tMs;
  Bytes bytes;
};

struct TraceData {
  bool present = false;
  std::map<int, std::string> processName;
  std::map<int, std::vector<Sample>> samples;            // pid -> memory counters, by time
  std::map<int, std::pair<double, double>> eventWindow;  // pid -> span of "memory events"
  std::map<int, double> spanSeconds;  // pid -> total duration of its compute spans
  std::map<int, int64_t> spans;
  double endMs = 0;
};

TraceData readTrace(const fs::path& p) {
  TraceData t;
  if (!fs::exists(p)) return t;
  json root;
  try {
    root = json::parse(readFile(p));
  } catch (const json::exception& e) {
    throw UserError(p.string() + ": not JSON (" + e.what() + "); rerun the training");
  }
  t.present = true;
  for (const auto& e : root.value("traceEvents", json::array())) {
    const std::string ph = e.value("ph", "");
    const int pid = e.value("pid", 0);
    if (ph == "M" && e.value("name", "") == "process_name") {
      t.processName[pid] = e["args"].value("name", "");
    } else if (ph == "C") {
      const std::string name = e.value("name", "");
      if (name != "memory" && name != "memory events") continue;
      double ts = e.value("ts", 0.0) / 1000.0;
      t.samples[pid].push_back({ts, bytesFromJson(e["args"])});
      if (name == "memory events") {
        auto w = t.eventWindow.emplace(pid, std::make_pair(ts, ts)).first;
        w->second.first = std::min(w->second.first, ts);
        w->second.second = std::max(w->second.second, ts);
      }
      t.endMs = std::max(t.endMs, ts);
    } else if (ph == "X") {
      double dur = e.value("dur", 0.0);
      t.spanSeconds[pid] += dur / 1e6;
      ++t.spans[pid];
      t.endMs = std::max(t.endMs, (e.value("ts", 0.0) + dur) / 1000.0);
    }
  }
  for (auto& [pid, v] : t.samples)
    std::stable_sort(v.begin(), v.end(),
                     [](const Sample& a, const Sample& b) { return a.tMs < b.tMs; });
  return t;
}

struct Metrics {
  std::vector<double> step, loss, sps, elapsed;
};

Metrics readMetrics(const fs::path& p) {
  Metrics m;
  std::ifstream f(p);
  if (!f) return m;
  std::string line;
  if (!std::getline(f, line)) return m;
  std::vector<std::string> cols;
  {
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) cols.push_back(c);
  }
  auto col = [&](const std::string& name) {
    auto it = std::find(cols.begin(), cols.end(), name);
    return it == cols.end() ? -1 : static_cast<int>(it - cols.begin());
  };
  const int cStep = col("step"), cLoss = col("loss"), cSps = col("samples_per_s"),
            cEl = col("elapsed_s");
  while (std::getline(f, line)) {
    std::vector<double> v;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) v.push_back(std::strtod(c.c_str(), nullptr));
    auto at = [&](int i) { return i >= 0 && i < static_cast<int>(v.size()) ? v[i] : NAN; };
    m.step.push_back(at(cStep));
    m.loss.push_back(at(cLoss));
    m.sps.push_back(at(cSps));
    m.elapsed.push_back(at(cEl));
  }
  return m;
}

// ------------------------------------------------------------------ gnuplot

void runGnuplot(const std::string& gnuplot, const fs::path& dir, const std::string& script,
                const std::string& name) {
  const fs::path gp = dir / (name + ".gp");
  writeFile(gp, script);
  const std::string cmd =
      "cd '" + dir.string() + "' && " + gnuplot + " '" + gp.filename().string() + "' 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("cannot start " + gnuplot);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int status = pclose(f);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code == 127)
    throw std::runtime_error("gnuplot not found (" + gnuplot +
                             "); install gnuplot-nox (scripts/setup does)");
  if (code != 0 || !fs::exists(dir / (name + ".svg")))
    throw std::runtime_error("gnuplot failed on " + gp.string() + ": " + out);
}

std::string svgHeader(const std::string& name, const std::string& title, int height = 340) {
  return "set terminal svg size 1000," + std::to_string(height) +
         " dynamic noenhanced font 'Helvetica,11' background rgb 'white'\n"
         "set output '" +
         name +
         ".svg'\n"
         "set title '" +
         title +
         "'\n"
         "set grid\n"
         "set key outside right top\n";
}

const char* kColors[kNumMemoryCategories] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                             "#59a14f", "#edc948", "#b07aa1"};

/// The stacked timeline of one device; returns false when there is nothing to draw.
bool memoryChart(const ReportOptions& o, const fs::path& dir, const std::string& name,
                 const std::string& title, std::vector<Sample> s, int64_t capacity) {
  if (s.empty()) return false;
  if (s.size() > o.maxTimelinePoints) {
    // Keep each bucket's highest sample: the chart must still show the peak.
    const size_t buckets = o.maxTimelinePoints / 2;
    const double t0 = s.front().tMs, t1 = s.back().tMs, w = std::max(t1 - t0, 1e-9) / buckets;
    std::vector<Sample> kept;
    size_t b = SIZE_MAX;
    for (const auto& x : s) {
      size_t bx = std::min(buckets - 1, static_cast<size_t>((x.tMs - t0) / w));
      if (bx != b || kept.empty()) {
        kept.push_back(x);
        b = bx;
      } else if (total(x.bytes) > total(kept.back().bytes)) {
        kept.back() = x;
      }
    }
    s.swap(kept);
  }
  std::array<bool, kNumMemoryCategories> used{};
  std::ostringstream dat;
  dat << "# time_ms then cumulative MiB per category:";
  for (MemoryCategory c : kAllMemoryCategories) dat << ' ' << toString(c);
  dat << '\n';
  auto row = [&](double t, const Bytes& b) {
    dat << t;
    double cum = 0;
    for (size_t c = 0; c < kNumMemoryCategories; ++c) {
      cum += static_cast<double>(b[c]) / kMiB;
      dat << ' ' << cum;
    }
    dat << '\n';
  };
  for (size_t i = 0; i < s.size(); ++i) {
    for (size_t c = 0; c < kNumMemoryCategories; ++c) used[c] = used[c] || s[i].bytes[c] != 0;
    if (i > 0) row(s[i].tMs, s[i - 1].bytes);  // counters are steps, not slopes
    row(s[i].tMs, s[i].bytes);
  }
  writeFile(dir / (name + ".dat"), dat.str());
  std::string gp = svgHeader(name, title);
  gp += "set xlabel 'time (ms)'\nset ylabel 'MiB'\nset style fill solid 0.85 noborder\n";
  int64_t peak = 0;
  for (const auto& x : s) peak = std::max(peak, total(x.bytes));
  gp += peak > 0 ? "set yrange [0:*]\n" : "set yrange [0:1]\n";
  std::string plot;
  for (int c = static_cast<int>(kNumMemoryCategories) - 1; c >= 0; --c) {
    if (!used[c]) continue;
    if (!plot.empty()) plot += ", \\\n  ";
    plot += "'" + name + ".dat' using 1:" + std::to_string(c + 2) +
            " with filledcurves x1 lc rgb '" + kColors[c] + "' title '" +
            toString(kAllMemoryCategories[c]) + "'";
  }
  if (plot.empty()) plot = "'" + name + ".dat' using 1:8 with lines lc rgb '#999999' title 'total'";
  if (capacity > 0 && peak * 2 > capacity)
    plot += ", \\\n  " + fmt(static_cast<double>(capacity) / kMiB, "%.4f") +
            " with lines dt 2 lw 2 lc rgb '#d62728' title 'capacity'";
  runGnuplot(o.gnuplot, dir, gp + "plot " + plot + "\n", name);
  return true;
}

bool curveChart(const ReportOptions& o, const fs::path& dir, const std::string& name,
                const std::string& title, const std::string& ylabel, const std::vector<double>& x,
                const std::vector<double>& y) {
  std::vector<std::pair<double, double>> points;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (std::isfinite(x[i]) && std::isfinite(y[i])) points.emplace_back(x[i], y[i]);
  if (points.empty()) return false;
  // One point per step made a 5-epoch run's curves 0.6 MB each (every point an SVG
  // element): above kMaxCurvePoints, each bucket of consecutive steps is drawn as its mean.
  constexpr size_t kMaxCurvePoints = 400;
  const size_t bucket = (points.size() + kMaxCurvePoints - 1) / kMaxCurvePoints;
  std::ostringstream dat;
  for (size_t b = 0; b < points.size(); b += bucket) {
    const size_t e = std::min(points.size(), b + bucket);
    double sx = 0, sy = 0;
    for (size_t i = b; i < e; ++i) {
      sx += points[i].first;
      sy += points[i].second;
    }
    dat << sx / double(e - b) << ' ' << sy / double(e - b) << '\n';
  }
  writeFile(dir / (name + ".dat"), dat.str());
  std::string gp = svgHeader(
      name, bucket > 1 ? title + " (mean of every " + std::to_string(bucket) + " steps)" : title,
      300);
  gp += "set xlabel 'step'\nset ylabel '" + ylabel + "'\nset key off\n";
  gp += "plot '" + name + ".dat' using 1:2 with linespoints pt 7 ps 0.3 lw 2 lc rgb '#4e79a7'\n";
  runGnuplot(o.gnuplot, dir, gp, name);
  return true;
}

std::string inlineSvg(const fs::path& p) {
  std::string s = readFile(p);
  auto at = s.find("<svg");
  return at == std::string::npos ? s : s.substr(at);
}

/// Offload counters, wherever summary.json carries them.
json findOffload(const json& summary) {
  if (summary.contains("offload") && !summary["offload"].is_null()) return summary["offload"];
  if (summary.contains("pipeline") && summary["pipeline"].is_object() &&
      summary["pipeline"].contains("offload") && !summary["pipeline"]["offload"].is_null())
    return summary["pipeline"]["offload"];
  return nullptr;
}

std::string jsonScalar(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// Note [Why stages are imbalanced]
// The warning names the busiest and the idlest device (busy seconds of the run). When the
// run folder has the plan its partition came from (pipefb_plan's, or the one pipefb_train
// chose itself, both saved as plan.yaml), it also says why the plan has the imbalance,
// from the plan's predicted time per microbatch and device: a split stage's F on its
// forward device, and its B plus its step's share (`step_time`, 0 in plan files before
// it) on its backward device, where the runtime runs its STEP; a same-device stage's pace
// (F + B + the step's share when compute sets it). Then:
//   the idlest device runs only forwards and the busiest backwards (PipeFB on 2S devices,
//     or a decoupled plan's forward device): backward devices run only B, and B is about
//     2F, so the imbalance is the design; the warning gives the plan's B/F. Folded PipeFB
//     has no such device (each also runs another stage's B), and two backward devices (a
//     decoupled plan's) are judged as below;
//   otherwise, when the plan predicted about this imbalance (within 1.25x of the measured
//     ratio), the planner's cut minimises the slowest stage at layer granularity under
//     devices.memory, so every other cut is slower or does not fit;
//   otherwise the planner predicted less: its profile misjudges the stages (re-measure).
std::optional<std::string> imbalanceWarning(const std::map<std::string, double>& busy,
                                            const fs::path& planPath) {
  double lo = 1e300, hi = 0;
  std::string loName, hiName;
  for (const auto& [n, b] : busy)
    if (b > 0) {
      if (b < lo) lo = b, loName = n;
      if (b > hi) hi = b, hiName = n;
    }
  if (!(hi > 0 && lo < 1e300 && hi > 1.25 * lo)) return std::nullopt;
  const std::string head = "imbalanced stages: " + hiName + " computed " + fmt(hi) + " s, " +
                           loName + " " + fmt(lo) + " s (" + fmt(hi / lo, "%.2f") + "x)";
  const std::string noPlan = head + "; rebalance pipeline.partition or let the planner choose it";
  if (!fs::exists(planPath)) return noPlan;
  // Predicted compute per microbatch on each device ("cpu:<index>").
  std::map<std::string, double> predicted;
  double forward = 0, backward = 0;
  // Devices that run a split stage's forward, and devices that run some backward: PipeFB
  // on 2S devices and decoupled plans have forward-only devices; folded PipeFB (Note
  // [Folded placements]) has none, as each device also runs another stage's backward.
  std::set<std::string> forwardDevices, backwardDevices;
  bool stepsMissing = false;  // a split stage without step_time (a plan file before it)
  try {
    const YAML::Node stages = YAML::LoadFile(planPath.string())["stages"];
    if (!stages || !stages.IsSequence()) return noPlan;
    for (const auto& st : stages) {
      const YAML::Node p = st["predicted"];
      if (!p || !p["forward_time"] || !p["backward_time"]) return noPlan;
      const std::string fd = "cpu:" + std::to_string(st["forward_device"].as<int>()),
                        bd = "cpu:" + std::to_string(st["backward_device"].as<int>());
      const double f = p["forward_time"].as<double>(), b = p["backward_time"].as<double>();
      const double step = p["step_time"] ? p["step_time"].as<double>() : 0.0;
      if (fd != bd) {
        predicted[fd] += f;
        predicted[bd] += b + step;
        stepsMissing = stepsMissing || !p["step_time"];
        forwardDevices.insert(fd);
      } else {
        predicted[fd] += p["pace"] ? p["pace"].as<double>() : f + b + step;
      }
      forward += f;
      backward += b;
      backwardDevices.insert(bd);
    }
  } catch (const YAML::Exception&) {
    return noPlan;
  }
  const std::string planned =
      "; the planner chose this partition (" + planPath.filename().string() + ")";
  const bool forwardOnlyIdle = forwardDevices.count(loName) && !backwardDevices.count(loName);
  if (forwardOnlyIdle && backwardDevices.count(hiName) && forward > 0)
    return head + planned + ": PipeFB runs only F on " + loName + " and only B on " + hiName +
           ", and B is " + fmt(backward / forward, "%.1f") +
           "x F in this plan (B is about 2F), so the backward devices compute more by design";
  if (!predicted.count(hiName) || !predicted.count(loName) || !(predicted[loName] > 0))
    return noPlan;
  const double ratio = predicted[hiName] / predicted[loName];
  const std::string what =
      fmt(ratio, "%.2f") + "x" +
      (stepsMissing ? " (optimizer steps left out: the plan file has no step_time; re-plan to "
                      "count them)"
                    : " (optimizer steps included)");
  if (ratio * 1.25 >= hi / lo)
    return head + planned + ", which predicted " + what +
           ": its cut minimises the slowest stage at layer granularity under devices.memory, "
           "so every other cut has a slower stage or does not fit";
  return head + planned + ", which predicted only " + what +
         ": its profile misjudges these stages; re-measure it (pipefb_profile --force) or set "
         "pipeline.partition";
}

// Note [Report sections]
// writeReport reads a run folder into a Report, whose steps each add one part (devices
// and their memory charts, warnings, predictions, curves), then writes memory.json and
// report.html from it, a section of the page per function.
struct Report {
  const ReportOptions& options;
  fs::path run, charts;
  json summary;
  std::string configText;
  TraceData trace;
  Metrics metrics;
  double wall = 0;
  json pipeline, offload, transfers, hostPool;
  std::map<std::string, double> busy;    // device -> busy seconds (pipeline runs)
  std::map<std::string, int> pidOfName;  // device -> its trace process
  json devices = json::array();          // memory.json's per-device entries
  std::vector<std::string> chartNames;   // charts/<name>.svg, in page order
  std::vector<std::string> warnings;
  double iterPredicted = NAN, iterMeasured = NAN;
  std::vector<int64_t> peakPredicted;  // per cpu:i, from the plan file
  std::string predictedNote =
      "no plan file (pipefb_plan's plan.yaml) in this run folder; predicted columns are empty "
      "(pipefb_report --plan PLAN RUN_DIR fills them)";

  Report(const std::string& runDir, const ReportOptions& o);
  fs::path planPath() const {
    return options.plan.empty() ? run / "plan.yaml" : fs::path(options.plan);
  }
  void addDevices();
  void addWarnings();
  void addPredictions();
  void addCurves();
  json memoryJson() const;
  std::string html() const;
  void htmlSummary(std::ostream& h) const;
  void htmlPeaks(std::ostream& h) const;
  void htmlTimelines(std::ostream& h) const;
  void htmlOffload(std::ostream& h) const;
  void htmlPredicted(std::ostream& h) const;
  void htmlCurvesPlanConfig(std::ostream& h) const;
};

Report::Report(const std::string& runDir, const ReportOptions& o) : options(o), run(runDir) {
  const fs::path summaryPath = run / "summary.json";
  if (!fs::exists(summaryPath))
    throw UserError(
        summaryPath.string() +
        ": no such file; RUN_DIR must be the output.dir of a finished pipefb_train run");
  try {
    summary = json::parse(readFile(summaryPath));
  } catch (const json::exception& e) {
    throw UserError(summaryPath.string() + ": not JSON (" + e.what() + ")");
  }
  if (!summary.contains("devices") || !summary["devices"].is_array())
    throw UserError(summaryPath.string() + ": no \"devices\" array; rerun the training");
  configText = fs::exists(run / "config.yaml") ? readFile(run / "config.yaml") : std::string();
  trace = readTrace(run / "trace.json");
  metrics = readMetrics(run / "metrics.csv");
  charts = run / "charts";
  fs::create_directories(charts);
  for (const auto& [pid, name] : trace.processName) pidOfName[name] = pid;
  wall = summary.value("wall_seconds", 0.0);
  pipeline = summary.contains("pipeline") ? summary["pipeline"] : json(nullptr);
  if (pipeline.is_object())
    for (const auto& d : pipeline.value("devices", json::array()))
      busy[d.value("name", "")] = d.value("busy_seconds", 0.0);
  offload = findOffload(summary);
  transfers =
      pipeline.is_object() && pipeline.contains("transfers") && pipeline["transfers"].is_array()
          ? pipeline["transfers"]
          : json::array();
  hostPool = pipeline.is_object() && pipeline.contains("host_pool") ? pipeline["host_pool"]
                                                                    : json(nullptr);
}

// Per device: the peak (summary.json, exact), its moment (the trace's highest sample).
void Report::addDevices() {
  for (const auto& d : summary["devices"]) {
    const std::string name = d.value("name", "?");
    const int64_t peak = d.value("peak_bytes", int64_t{0});
    const int64_t capacity = d.contains("capacity_bytes") && d["capacity_bytes"].is_number()
                                 ? d["capacity_bytes"].get<int64_t>()
                                 : -1;
    json dj = {
        {"name", name},
        {"capacity_bytes", capacity >= 0 ? json(capacity) : json(nullptr)},
        {"peak_bytes", peak},
        {"at_peak", nullptr},
        {"utilization", capacity > 0 ? json(static_cast<double>(peak) / capacity) : json(nullptr)},
        {"peak_time_ms", nullptr},
        {"trace_peak_bytes", nullptr},
        {"trace_at_peak", nullptr},
        {"busy_seconds", busy.count(name) ? json(busy[name]) : json(nullptr)},
        {"predicted_peak_bytes", nullptr}};
    dj["at_peak"] = bytesToJson(bytesFromJson(d.value("peak_by_category", json::object())));
    auto pid = pidOfName.find(name);
    const std::vector<Sample>* samples = nullptr;
    // A track without counters (the host pool of a run that never offloaded) is flat.
    const std::vector<Sample> flat = {{0.0, Bytes{}}, {trace.endMs, Bytes{}}};
    if (pid != pidOfName.end())
      samples = trace.samples.count(pid->second) ? &trace.samples.at(pid->second) : &flat;
    if (samples && !samples->empty()) {
      const Sample* best = &samples->front();
      for (const auto& s : *samples)
        if (total(s.bytes) > total(best->bytes)) best = &s;
      dj["peak_time_ms"] = best->tMs;
      dj["trace_peak_bytes"] = total(best->bytes);
      dj["trace_at_peak"] = bytesToJson(best->bytes);
      dj["trace_samples"] = samples->size();
    }
    if (capacity > 0 && peak >= 0.95 * static_cast<double>(capacity))
      warnings.push_back(name + " peaked at " + fmtMiB(peak) + ", within 5% of its capacity " +
                         fmtMiB(capacity) + " (" + fmt(100.0 * peak / capacity, "%.1f") + "%)");
    const std::string chart = "memory-" + fileSafe(name);
    if (samples && memoryChart(options, charts, chart, name + ": live memory by category (stacked)",
                               *samples, capacity)) {
      chartNames.push_back(chart);
      dj["chart"] = "charts/" + chart + ".svg";
    }
    // The allocator's event stream covers the first step(s) of the trace window only; when
    // the samples reach beyond it, a second chart shows it at full resolution. (A test on
    // how long it lasts against the whole, e.g. "under half", follows the machine's timing
    // noise on short steps: ReportTest.SingleDeviceRunLeavesAReport failed in half its runs.)
    if (samples && pid != pidOfName.end() && trace.eventWindow.count(pid->second)) {
      const auto [w0, w1] = trace.eventWindow.at(pid->second);
      const double all = samples->back().tMs - samples->front().tMs;
      if (w1 > w0 && all > w1 - w0) {
        std::vector<Sample> window;
        for (const auto& x : *samples)
          if (x.tMs >= w0 && x.tMs <= w1) window.push_back(x);
        const std::string detail = chart + "-detail";
        if (memoryChart(options, charts, detail,
                        name + ": the first iterations, every allocation and free (stacked)",
                        window, capacity)) {
          chartNames.push_back(detail);
          dj["chart_detail"] = "charts/" + detail + ".svg";
        }
      }
    }
    devices.push_back(dj);
  }
}

// Stalls (offload) and imbalance (pipeline stages).
void Report::addWarnings() {
  for (const auto& t : transfers) {
    const double stall = t.value("stall_seconds", 0.0);
    if (wall > 0 && stall > 0.05 * wall)
      warnings.push_back(
          t.value("name", "?") + " stalled " + fmt(stall) + " s waiting for prefetches, " +
          fmt(100.0 * stall / wall, "%.1f") +
          "% of the run (> 5%); prefetch earlier (pipeline.lookahead) or offload less");
  }
  if (offload.is_object()) {
    for (const auto& [k, v] : offload.items())
      if (k.find("stall") != std::string::npos && k.find("seconds") != std::string::npos &&
          v.is_number() && wall > 0 && v.get<double>() > 0.05 * wall)
        warnings.push_back("offload stalls: " + k + " = " + fmt(v.get<double>()) + " s, " +
                           fmt(100.0 * v.get<double>() / wall, "%.1f") + "% of the run (> 5%)");
  }
  if (pipeline.is_object())
    for (const auto& d : pipeline.value("devices", json::array()))
      if (d.contains("stall_seconds") && d["stall_seconds"].is_number() && wall > 0 &&
          d["stall_seconds"].get<double>() > 0.05 * wall)
        warnings.push_back(d.value("name", "?") + " stalled " +
                           fmt(d["stall_seconds"].get<double>()) + " s (> 5% of the run)");
  if (auto w = imbalanceWarning(busy, planPath())) warnings.push_back(*w);
}

// Predictions: the plan file's `predicted:` section (pipefb_plan's cost model), and the
// measured iteration time (metrics.csv).
void Report::addPredictions() {
  const fs::path plan = planPath();
  if (!options.plan.empty() && !fs::exists(plan))
    throw UserError(plan.string() + ": no such plan file (--plan)");
  if (fs::exists(plan)) {
    try {
      YAML::Node y = YAML::LoadFile(plan.string());
      YAML::Node p = y["predicted"];
      if (p && p["iteration_time"]) iterPredicted = p["iteration_time"].as<double>();
      if (p && p["peak_memory"])
        for (const auto& v : p["peak_memory"]) peakPredicted.push_back(v.as<int64_t>());
    } catch (const YAML::Exception& e) {
      throw UserError(plan.string() + ": not a plan file (" + e.what() + ")");
    }
    predictedNote = "predicted by the cost model of the plan file " + plan.string() +
                    "; the planner's device i is the run's cpu:i";
  }
  for (auto& dj : devices) {
    const std::string n = dj["name"].get<std::string>();
    if (n.rfind("cpu:", 0) != 0) continue;
    const size_t i = std::strtoul(n.c_str() + 4, nullptr, 10);
    if (i < peakPredicted.size()) dj["predicted_peak_bytes"] = peakPredicted[i];
  }

  // Iteration time, measured (from metrics.csv).
  if (metrics.elapsed.size() >= 2) {
    const size_t n = metrics.elapsed.size();
    iterMeasured = (metrics.elapsed[n - 1] - metrics.elapsed[0]) / static_cast<double>(n - 1);
  } else if (metrics.elapsed.size() == 1) {
    iterMeasured = metrics.elapsed[0];
  }
}

void Report::addCurves() {
  if (curveChart(options, charts, "loss", "training loss", "loss", metrics.step, metrics.loss))
    chartNames.push_back("loss");
  if (curveChart(options, charts, "throughput", "throughput (cumulative)", "samples/s",
                 metrics.step, metrics.sps))
    chartNames.push_back("throughput");
}

json Report::memoryJson() const {
  return {{"run_dir", run.string()},
          {"model", summary.value("model", "")},
          {"schedule", summary.value("schedule", "")},
          {"wall_seconds", wall},
          {"steps", summary.value("steps", int64_t{0})},
          {"devices", devices},
          {"offload", offload},
          {"transfers", transfers},
          {"host_pool", hostPool},
          {"iteration_seconds",
           {{"measured", std::isfinite(iterMeasured) ? json(iterMeasured) : json(nullptr)},
            {"predicted", std::isfinite(iterPredicted) ? json(iterPredicted) : json(nullptr)}}},
          {"predicted_note", predictedNote},
          {"trace", {{"present", trace.present}, {"end_ms", trace.endMs}}},
          {"warnings", warnings}};
}

std::string Report::html() const {
  std::ostringstream h;
  const std::string title = "pipefb report: " + summary.value("model", std::string("?")) + ", " +
                            summary.value("schedule", std::string("?"));
  h << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << escapeHtml(title)
    << "</title>\n<style>body{font-family:Helvetica,Arial,sans-serif;margin:24px;max-width:1100px}"
       "table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid "
       "#ccc;padding:4px 8px;"
       "text-align:right}th{background:#f2f2f2}td:first-child{text-align:left}pre{background:#"
       "f7f7f7;"
       "padding:8px;overflow:auto}.warn{color:#b00020}.chart svg{max-width:100%;height:auto}"
       "</style></head><body>\n";
  h << "<h1>" << escapeHtml(title) << "</h1>\n";
  htmlSummary(h);
  htmlPeaks(h);
  htmlTimelines(h);
  htmlOffload(h);
  htmlPredicted(h);
  htmlCurvesPlanConfig(h);
  return h.str();
}

void Report::htmlSummary(std::ostream& h) const {
  h << "<p>" << summary.value("steps", int64_t{0}) << " steps, "
    << fmt(summary.value("throughput_samples_per_s", 0.0), "%.1f") << " samples/s, "
    << fmt(wall, "%.1f") << " s wall, final loss " << fmt(summary.value("final_loss", 0.0), "%.4f")
    << ". Run folder: <code>" << escapeHtml(run.string()) << "</code></p>\n";

  h << "<h2>Warnings</h2>\n";
  if (warnings.empty())
    h << "<p>None.</p>\n";
  else {
    h << "<ul>\n";
    for (const auto& w : warnings) h << "<li class=\"warn\">" << escapeHtml(w) << "</li>\n";
    h << "</ul>\n";
  }
}

void Report::htmlPeaks(std::ostream& h) const {
  h << "<h2>Peak memory per device</h2>\n<table><tr><th>device</th><th>peak</th><th>capacity</th>"
       "<th>use</th><th>at (ms)</th><th>trace max</th>";
  for (MemoryCategory c : kAllMemoryCategories) h << "<th>" << toString(c) << "</th>";
  h << "</tr>\n";
  for (const auto& dj : devices) {
    h << "<tr><td>" << escapeHtml(dj["name"].get<std::string>()) << "</td><td>"
      << fmtMiB(dj["peak_bytes"].get<int64_t>()) << "</td><td>"
      << (dj["capacity_bytes"].is_null() ? "unlimited"
                                         : fmtMiB(dj["capacity_bytes"].get<int64_t>()))
      << "</td><td>"
      << (dj["utilization"].is_null() ? "" : fmt(100 * dj["utilization"].get<double>(), "%.1f%%"))
      << "</td><td>"
      << (dj["peak_time_ms"].is_null() ? "" : fmt(dj["peak_time_ms"].get<double>(), "%.1f"))
      << "</td><td>"
      << (dj["trace_peak_bytes"].is_null() ? "" : fmtMiB(dj["trace_peak_bytes"].get<int64_t>()))
      << "</td>";
    for (MemoryCategory c : kAllMemoryCategories)
      h << "<td>" << fmtMiB(dj["at_peak"][toString(c)].get<int64_t>()) << "</td>";
    h << "</tr>\n";
  }
  h << "</table>\n<p>The breakdown is the allocator's, at the instant of the peak. The moment is "
       "the trace's highest memory sample (trace.json); it may miss a short-lived peak between "
       "samples, or outside the traced steps (evaluation runs after training on the same "
       "device).</p>\n";
}

void Report::htmlTimelines(std::ostream& h) const {
  h << "<h2>Memory timelines</h2>\n";
  if (!trace.present) h << "<p>No trace.json in this run folder.</p>\n";
  for (const auto& c : chartNames)
    if (c.rfind("memory-", 0) == 0)
      h << "<div class=\"chart\" data-src=\"charts/" << c << ".svg\">"
        << inlineSvg(charts / (c + ".svg")) << "</div>\n";
}

void Report::htmlOffload(std::ostream& h) const {
  h << "<h2>Offload traffic</h2>\n";
  bool anyTraffic = false;
  for (const auto& t : transfers)
    anyTraffic =
        anyTraffic || t.value("bytes_d2h", int64_t{0}) + t.value("bytes_h2d", int64_t{0}) > 0;
  if (!transfers.empty()) {
    h << "<table><tr><th>device</th><th>offloaded (D2H)</th><th>prefetched (H2D)</th>"
         "<th>offloads</th><th>prefetches</th><th>copy (s)</th><th>overlap</th><th>stall (s)</th>"
         "</tr>\n";
    for (const auto& t : transfers)
      h << "<tr><td>" << escapeHtml(t.value("name", "?")) << "</td><td>"
        << fmtMiB(t.value("bytes_d2h", int64_t{0})) << "</td><td>"
        << fmtMiB(t.value("bytes_h2d", int64_t{0})) << "</td><td>"
        << t.value("offloads", int64_t{0}) << "</td><td>" << t.value("prefetches", int64_t{0})
        << "</td><td>" << fmt(t.value("copy_seconds", 0.0), "%.4f") << "</td><td>"
        << (t.contains("overlap_pct") && t["overlap_pct"].is_number()
                ? fmt(t["overlap_pct"].get<double>(), "%.1f%%")
                : std::string())
        << "</td><td>" << fmt(t.value("stall_seconds", 0.0), "%.4f") << "</td></tr>\n";
    h << "</table>\n";
    if (!anyTraffic) h << "<p>No bytes moved: this run did not offload.</p>\n";
  }
  if (hostPool.is_object()) {
    h << "<p>Host pool:";
    for (const auto& [k, v] : hostPool.items())
      h << " " << escapeHtml(k) << " " << escapeHtml(jsonScalar(v)) << ";";
    h << "</p>\n";
  }
  if (offload.is_object() && !offload.empty()) {
    h << "<table><tr><th>counter</th><th>value</th></tr>\n";
    for (const auto& [k, v] : offload.items())
      h << "<tr><td>" << escapeHtml(k) << "</td><td>" << escapeHtml(jsonScalar(v))
        << "</td></tr>\n";
    h << "</table>\n";
  } else if (transfers.empty()) {
    h << "<p>No offload counters in summary.json (this run did not offload, or its runtime does "
         "not report them).</p>\n";
  }
}

void Report::htmlPredicted(std::ostream& h) const {
  h << "<h2>Predicted against measured</h2>\n<table><tr><th>quantity</th><th>predicted</th>"
       "<th>measured</th><th>measured / predicted</th></tr>\n<tr><td>iteration time (s)</td><td>"
    << (std::isfinite(iterPredicted) ? fmt(iterPredicted, "%.4f") : "") << "</td><td>"
    << (std::isfinite(iterMeasured) ? fmt(iterMeasured, "%.4f") : "") << "</td><td>"
    << (std::isfinite(iterPredicted) && std::isfinite(iterMeasured) && iterPredicted > 0
            ? fmt(iterMeasured / iterPredicted, "%.2f")
            : std::string())
    << "</td></tr>\n";
  for (const auto& dj : devices) {
    const bool pred = dj["predicted_peak_bytes"].is_number();
    const int64_t pp = pred ? dj["predicted_peak_bytes"].get<int64_t>() : 0;
    h << "<tr><td>peak " << escapeHtml(dj["name"].get<std::string>()) << "</td><td>"
      << (pred ? fmtMiB(pp) : std::string()) << "</td><td>"
      << fmtMiB(dj["peak_bytes"].get<int64_t>()) << "</td><td>"
      << (pred && pp > 0 ? fmt(static_cast<double>(dj["peak_bytes"].get<int64_t>()) / pp, "%.2f")
                         : std::string())
      << "</td></tr>\n";
  }
  h << "</table>\n<p>" << escapeHtml(predictedNote) << ".</p>\n";
}

void Report::htmlCurvesPlanConfig(std::ostream& h) const {
  h << "<h2>Loss and throughput</h2>\n";
  for (const auto& c : {"loss", "throughput"})
    if (std::find(chartNames.begin(), chartNames.end(), c) != chartNames.end())
      h << "<div class=\"chart\" data-src=\"charts/" << c << ".svg\">"
        << inlineSvg(charts / (std::string(c) + ".svg")) << "</div>\n";
  if (metrics.step.empty()) h << "<p>No metrics.csv in this run folder.</p>\n";

  h << "<h2>Plan</h2>\n";
  if (pipeline.is_object()) {
    h << "<table><tr><th>key</th><th>value</th></tr>\n";
    for (const auto& k : {"schedule", "partition"})
      if (pipeline.contains(k))
        h << "<tr><td>" << k << "</td><td>" << escapeHtml(jsonScalar(pipeline[k]))
          << "</td></tr>\n";
    if (pipeline.contains("contract"))
      for (const auto& [k, v] : pipeline["contract"].items())
        h << "<tr><td>contract." << escapeHtml(k) << "</td><td>" << escapeHtml(jsonScalar(v))
          << "</td></tr>\n";
    if (pipeline.contains("stash_bytes_per_microbatch"))
      h << "<tr><td>stash bytes per microbatch</td><td>"
        << escapeHtml(pipeline["stash_bytes_per_microbatch"].dump()) << "</td></tr>\n";
    h << "</table>\n";
  } else {
    h << "<p>Single device (pipeline.schedule none): the whole model on "
      << escapeHtml(devices.empty() ? std::string("?") : devices[0]["name"].get<std::string>())
      << ".</p>\n";
  }
  h << "<h2>Configuration (config.yaml)</h2>\n<pre>" << escapeHtml(configText) << "</pre>\n";
  h << "<p>Machine-readable: <a href=\"memory.json\">memory.json</a>, <a href=\"trace.json\">"
       "trace.json</a> (open in Perfetto), <a href=\"metrics.csv\">metrics.csv</a>, "
       "<a href=\"summary.json\">summary.json</a>.</p>\n</body></html>\n";
}

}  // namespace

ReportResult writeReport(const std::string& runDir, const ReportOptions& options) {
  Report r(runDir, options);
  r.addDevices();
  r.addWarnings();
  r.addPredictions();
  r.addCurves();
  ReportResult result;
  result.memoryJson = (r.run / "memory.json").string();
  writeFile(result.memoryJson, r.memoryJson().dump(2) + "\n");
  for (const auto& c : r.chartNames) result.charts.push_back((r.charts / (c + ".svg")).string());
  result.html = (r.run / "report.html").string();
  writeFile(result.html, r.html());
  result.warnings = r.warnings;
  return result;
}

}  // namespace pipefb::report
