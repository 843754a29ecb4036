// Memory-budget sweeps (Sweep.h).
#include "pipefb/planner/Sweep.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Size.h"
#include "pipefb/schedules/ScheduleKind.h"

namespace pipefb::planner {

namespace fs = std::filesystem;

std::vector<std::int64_t> parseBudgets(const std::string& text) {
  auto size = [&](const std::string& t) {
    auto v = parseSize(t);
    if (!v || *v <= 0)
      throw UserError("--budgets: '" + t +
                      "' is not a size; expected LOW:HIGH:COUNT such as "
                      "256MiB:4GiB:12, or a list such as 1GiB,2GiB");
    return *v;
  };
  std::vector<std::int64_t> out;
  if (text.find(':') != std::string::npos) {
    std::vector<std::string> parts;
    std::stringstream ss(text);
    std::string p;
    while (std::getline(ss, p, ':')) parts.push_back(p);
    if (parts.size() != 3)
      throw UserError("--budgets: expected LOW:HIGH:COUNT such as 256MiB:4GiB:12, got '" + text +
                      "'");
    const std::int64_t lo = size(parts[0]), hi = size(parts[1]);
    int n = 0;
    try {
      n = std::stoi(parts[2]);
    } catch (const std::exception&) {
    }
    if (n < 1 || lo > hi || (n == 1 && lo != hi))
      throw UserError("--budgets: need LOW <= HIGH and COUNT >= 2 (or LOW == HIGH), got '" + text +
                      "'");
    for (int i = 0; i < n; ++i) {
      const double t = n == 1 ? 0 : double(i) / (n - 1);
      out.push_back(
          std::llround(std::exp(std::log(double(lo)) * (1 - t) + std::log(double(hi)) * t)));
    }
    return out;
  }
  std::stringstream ss(text);
  std::string p;
  while (std::getline(ss, p, ',')) out.push_back(size(p));
  return out;
}

std::vector<std::string> defaultSweepFamilies() {
  // 1f1b with each single policy beside the free choice, then every kind (ScheduleKind.h).
  std::vector<std::string> out = {"1f1b-keep", "1f1b-offload"};
  for (ScheduleKind k : allScheduleKinds()) out.push_back(toString(k));
  return out;
}

SweepResult runSweep(const CostModel& model, const SolverOptions& base,
                     const std::vector<std::int64_t>& budgets,
                     const std::vector<std::string>& families) {
  const auto t0 = std::chrono::steady_clock::now();
  SweepResult r;
  r.families = families;
  for (const std::string& name : families) {
    SolverOptions o = base;
    o.schedules = {parseScheduleFamily(name)};
    SolveResult m = minimalBudget(model, o);
    r.minimalBudget[name] = m.minimalBudget;
    if (m.minimalBudget >= 0 && m.minimalPlan) r.minimalPlan[name] = *m.minimalPlan;
    for (std::int64_t b : budgets) {
      SweepPoint pt;
      pt.family = name;
      pt.budget = b;
      // Below the smallest feasible budget nothing fits: no need to search.
      if (m.minimalBudget >= 0 && b >= m.minimalBudget) {
        o.budget = b;
        SolveResult s = solve(model, o);
        pt.feasible = s.feasible;
        if (s.feasible) pt.plan = s.best;
      }
      r.points.push_back(pt);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::int64_t MeasuredRun::peakMax() const {
  std::int64_t m = 0;
  for (auto b : peak) m = std::max(m, b);
  return m;
}

MeasuredRun readMeasuredRun(const std::string& dir) {
  MeasuredRun m;
  m.ran = true;
  const std::string summary = dir + "/summary.json";
  try {
    // JSON is YAML (flow style).
    YAML::Node j = YAML::LoadFile(summary);
    m.throughput = j["throughput_samples_per_s"].as<double>();
    for (const auto& d : j["devices"]) {
      const std::string name = d["name"].as<std::string>();
      const std::int64_t peak = d["peak_bytes"].as<std::int64_t>();
      if (name.rfind("cpu:", 0) == 0) {
        const size_t i = std::stoul(name.substr(4));
        if (m.peak.size() <= i) m.peak.resize(i + 1, 0);
        m.peak[i] = peak;
      } else if (name == "host") {
        m.hostPeak = peak;
      }
    }
  } catch (const std::exception& e) {
    throw UserError(summary + ": cannot read the run summary: " + e.what());
  }
  // metrics.csv: step,epoch,loss,lr,samples_per_s,elapsed_s (one row per logged step).
  std::ifstream in(dir + "/metrics.csv");
  std::string line;
  std::vector<std::pair<long, double>> rows;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    if (f.size() >= 6) rows.emplace_back(std::stol(f[0]), std::stod(f[5]));
  }
  std::vector<double> dt;
  for (size_t i = 2; i < rows.size(); ++i)  // skip the first step (warm-up)
    if (rows[i].first > rows[i - 1].first)
      dt.push_back((rows[i].second - rows[i - 1].second) /
                   double(rows[i].first - rows[i - 1].first));
  if (!dt.empty()) {
    std::sort(dt.begin(), dt.end());
    m.iterationTime =
        dt.size() % 2 ? dt[dt.size() / 2] : 0.5 * (dt[dt.size() / 2 - 1] + dt[dt.size() / 2]);
  }
  return m;
}

std::string sweepCsv(const SweepResult& r) {
  std::ostringstream o;
  o << std::setprecision(9);
  o << "family,budget_bytes,budget_mib,feasible,schedule,stages,microbatches,microbatch_size,"
       "policies,iteration_time_s,throughput_samples_s,simulated_iteration_time_s,peak_bytes,"
       "host_bytes,min_feasible_budget_bytes";
  bool measured = false;
  for (const SweepPoint& p : r.points) measured = measured || p.measured.ran;
  if (measured)
    o << ",predicted_peaks,measure_exit,measured_iteration_time_s,measured_throughput_samples_s,"
         "measured_peak_bytes,measured_peaks,measured_host_peak_bytes,measure_note";
  o << "\n";
  auto joined = [](const std::vector<std::int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ";" : "") + std::to_string(v[i]);
    return s;
  };
  for (const SweepPoint& p : r.points) {
    o << p.family << "," << p.budget << "," << double(p.budget) / (1 << 20) << ","
      << (p.feasible ? 1 : 0) << ",";
    if (p.feasible) {
      const Plan& pl = p.plan;
      std::string pols;
      for (size_t k = 0; k < pl.stages.size(); ++k)
        pols += (k ? "|" : "") + std::string(schedules::toString(pl.stages[k].policy));
      o << toString(pl.shape.kind) << "," << pl.shape.stages << "," << pl.shape.microbatches << ","
        << pl.shape.microbatchSize << "," << pols << "," << pl.iterationTime << "," << pl.throughput
        << "," << (pl.simulated ? pl.simIterationTime : 0.0) << "," << pl.peakMemory << ","
        << pl.hostBytes;
    } else {
      o << ",,,,,,,,,";
    }
    o << "," << r.minimalBudget.at(p.family);
    if (measured) {
      const MeasuredRun& m = p.measured;
      std::string note = m.note;
      for (char& c : note)
        if (c == ',' || c == '\n' || c == '"') c = ' ';
      o << "," << (p.feasible ? joined(p.plan.deviceMemory) : "") << ",";
      if (m.ran) {
        o << m.exitCode << ",";
        if (m.exitCode == 0)
          o << m.iterationTime << "," << m.throughput << "," << m.peakMax() << "," << joined(m.peak)
            << "," << m.hostPeak;
        else
          o << ",,,,";
      } else {
        o << ",,,,,";
      }
      o << "," << note;
    }
    o << "\n";
  }
  return o.str();
}

std::string sweepGnuplot(const SweepResult& r, const std::string& csvName,
                         const std::string& pngName, const std::string& title) {
  std::ostringstream o;
  o << "# Throughput against the per-device memory budget, one line per schedule family;\n"
       "# the dashed verticals mark each family's smallest feasible budget.\n"
       "# Written by pipefb_sweep: gnuplot sweep.gp\n";
  o << "set datafile separator ','\n";
  o << "set terminal pngcairo size 1100,650 noenhanced\n";
  o << "set output '" << pngName << "'\n";
  o << "set title '" << title << "'\n";
  o << "set xlabel 'memory budget per device (MiB)'\nset ylabel 'throughput (samples/s)'\n";
  o << "set logscale x 2\nset key outside right top\nset grid\nset yrange [0:*]\n";
  int i = 1;
  for (const auto& f : r.families) {
    const std::int64_t m = r.minimalBudget.at(f);
    if (m >= 0)
      o << "set arrow from " << double(m) / (1 << 20) << ", graph 0 to " << double(m) / (1 << 20)
        << ", graph 1 nohead dashtype 2 linecolor " << i << "\n";
    ++i;
  }
  o << "plot \\\n";
  i = 1;
  for (const auto& f : r.families) {
    const std::int64_t m = r.minimalBudget.at(f);
    std::string label = f + (m >= 0 ? " (fits from " + formatBytes(m) + ")" : " (never fits)");
    o << "  '" << csvName << "' every ::1 using 3:(strcol(1) eq '" << f
      << "' && $4 == 1 ? $11 : 1/0) with linespoints linecolor " << i << " pointtype "
      << (i % 13 + 1) << " title '" << label << "'"
      << (i < int(r.families.size()) ? ", \\\n" : "\n");
    ++i;
  }
  return o.str();
}

std::vector<std::string> writeSweep(const SweepResult& r, const std::string& dir,
                                    const std::string& title) {
  fs::create_directories(dir);
  std::vector<std::string> out;
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = (fs::path(dir) / name).string();
    std::ofstream f(path);
    if (!f) throw UserError("cannot write '" + path + "'");
    f << text;
    out.push_back(path);
  };
  write("sweep.csv", sweepCsv(r));
  write("sweep.gp", sweepGnuplot(r, "sweep.csv", "sweep.png", title));
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    const std::string cmd = "cd '" + dir + "' && gnuplot sweep.gp 2>/dev/null";
    if (std::system(cmd.c_str()) == 0) out.push_back((fs::path(dir) / "sweep.png").string());
  }
  return out;
}

}  // namespace pipefb::planner
