// Device and cluster spec files (docs/planner.md, "Device and cluster specs").
#include "pipefb/planner/DeviceSpec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "pipefb/common/Error.h"
#include "pipefb/common/Size.h"
#include "pipefb/common/Suggest.h"

namespace pipefb::planner {

namespace fs = std::filesystem;

namespace {

std::string readFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw UserError(what + " '" + path + "' cannot be read (does the file exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string where(const std::string& source, const YAML::Node& n) {
  if (n.Mark().line >= 0) return source + ":" + std::to_string(n.Mark().line + 1);
  return source;
}

void checkKeys(const YAML::Node& map, const std::vector<std::string>& allowed,
               const std::string& source, const std::string& section) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      throw UserError(where(source, it->first) + ": unknown key '" + section + k + "'" +
                      didYouMean(k, allowed) + "; allowed: " + joinAllowed(allowed));
  }
}

double number(const YAML::Node& n, const std::string& key, const std::string& source) {
  try {
    return n.as<double>();
  } catch (const YAML::Exception&) {
    throw UserError(where(source, n) + ": " + key + " must be a number, got '" + n.Scalar() + "'");
  }
}

double positive(double v, const std::string& key, const std::string& source) {
  if (!(v > 0)) throw UserError(source + ": " + key + " must be > 0");
  return v;
}

}  // namespace

double parseSeconds(const std::string& textIn, const std::string& key) {
  std::string t = textIn;
  t.erase(std::remove_if(t.begin(), t.end(), ::isspace), t.end());
  static const std::vector<std::pair<std::string, double>> units = {
      {"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}};
  double mult = 1;
  for (const auto& [u, m] : units)
    if (t.size() > u.size() && t.compare(t.size() - u.size(), u.size(), u) == 0 &&
        (std::isdigit(static_cast<unsigned char>(t[t.size() - u.size() - 1])) ||
         t[t.size() - u.size() - 1] == '.')) {
      t = t.substr(0, t.size() - u.size());
      mult = m;
      break;
    }
  try {
    size_t pos = 0;
    double v = std::stod(t, &pos);
    if (pos != t.size() || v < 0) throw std::invalid_argument("x");
    return v * mult;
  } catch (const std::exception&) {
    throw UserError(key + ": expected a time such as 10us, 2ms or 1e-5 (seconds), got '" + textIn +
                    "'");
  }
}

double parseBandwidth(const std::string& text, const std::string& key) {
  std::string t = text;
  for (const std::string suffix : {"/s", "ps"})
    if (t.size() > suffix.size() && t.compare(t.size() - suffix.size(), suffix.size(), suffix) == 0)
      t = t.substr(0, t.size() - suffix.size());
  if (auto v = parseSize(t); v && *v > 0) return static_cast<double>(*v);
  try {
    size_t pos = 0;
    double v = std::stod(t, &pos);
    if (pos == t.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw UserError(key +
                  ": expected a bandwidth in bytes per second such as 12GB, 900GiB or "
                  "1.2e10, got '" +
                  text + "'");
}

DeviceSpec parseDeviceSpec(const std::string& yaml, const std::string& source) {
  YAML::Node n;
  try {
    n = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw UserError(source + ": not valid YAML: " + e.what());
  }
  if (!n.IsMap()) throw UserError(source + ": a device spec is a map of keys");
  const std::vector<std::string> keys = {"name",         "description",   "peak_flops",
                                         "memory",       "hbm_bandwidth", "pcie_bandwidth",
                                         "host_latency", "efficiency",    "layer_overhead",
                                         "bf16_flops",   "fp16_flops"};
  checkKeys(n, keys, source, "");
  for (const char* req :
       {"name", "peak_flops", "memory", "hbm_bandwidth", "pcie_bandwidth", "efficiency"})
    if (!n[req]) throw UserError(source + ": missing key '" + req + "'");
  DeviceSpec d;
  d.name = n["name"].as<std::string>();
  if (n["description"]) d.description = n["description"].as<std::string>();
  d.peakFlops = positive(number(n["peak_flops"], "peak_flops", source), "peak_flops", source);
  if (n["bf16_flops"])
    d.bf16Flops = positive(number(n["bf16_flops"], "bf16_flops", source), "bf16_flops", source);
  if (n["fp16_flops"])
    d.fp16Flops = positive(number(n["fp16_flops"], "fp16_flops", source), "fp16_flops", source);
  auto mem = parseSize(n["memory"].as<std::string>());
  if (!mem || *mem <= 0)
    throw UserError(where(source, n["memory"]) + ": memory must be a size such as 16GiB, got '" +
                    n["memory"].as<std::string>() + "'");
  d.memory = *mem;
  d.hbmBandwidth = parseBandwidth(n["hbm_bandwidth"].as<std::string>(), source + ": hbm_bandwidth");
  d.pcieBandwidth =
      parseBandwidth(n["pcie_bandwidth"].as<std::string>(), source + ": pcie_bandwidth");
  if (n["host_latency"])
    d.hostLatency = parseSeconds(n["host_latency"].as<std::string>(), source + ": host_latency");
  d.efficiency = number(n["efficiency"], "efficiency", source);
  if (!(d.efficiency > 0 && d.efficiency <= 1))
    throw UserError(source + ": efficiency must be in (0, 1], got " +
                    n["efficiency"].as<std::string>());
  if (n["layer_overhead"])
    d.layerOverhead =
        parseSeconds(n["layer_overhead"].as<std::string>(), source + ": layer_overhead");
  return d;
}

double flopsAt(const DeviceSpec& d, Precision precision) {
  const double f = precision == Precision::BF16   ? d.bf16Flops
                   : precision == Precision::FP16 ? d.fp16Flops
                                                  : d.peakFlops;
  if (f <= 0)
    throw UserError(std::string("training.precision: ") + toString(precision) + ": device " +
                    d.name + " has no " + toString(precision) + " FLOP rate in its spec (key " +
                    toString(precision) + "_flops); allowed on it: fp32" +
                    (d.bf16Flops > 0 ? ", bf16" : "") + (d.fp16Flops > 0 ? ", fp16" : ""));
  return f;
}

DeviceSpec loadDeviceSpec(const std::string& path) {
  return parseDeviceSpec(readFile(path, "device spec"), path);
}

std::vector<std::string> deviceSpecNames(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".yaml") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

DeviceSpec findDeviceSpec(const std::string& nameOrPath, const std::string& dir) {
  if (fs::exists(nameOrPath) && fs::is_regular_file(nameOrPath)) return loadDeviceSpec(nameOrPath);
  fs::path p = fs::path(dir) / (nameOrPath + ".yaml");
  if (fs::exists(p)) return loadDeviceSpec(p.string());
  auto names = deviceSpecNames(dir);
  throw UserError("unknown device '" + nameOrPath + "'" + didYouMean(nameOrPath, names) +
                  "; allowed: " + joinAllowed(names) + " (files in " + dir + "), or a path");
}

Cluster ClusterSpec::toCluster(const std::vector<double>& speeds) const {
  Cluster c;
  c.name = name;
  for (size_t i = 0; i < devices.size(); ++i) {
    ClusterDevice d;
    d.name = devices[i].name + ":" + std::to_string(i);
    d.speed = i < speeds.size() ? speeds[i] : 1.0;
    d.capacity = devices[i].memory;
    d.host = Link{devices[i].pcieBandwidth, devices[i].hostLatency};
    d.process = i < processes.size() ? processes[i] : 0;
    c.devices.push_back(d);
  }
  c.links = links;
  c.hostPool = hostPool;
  c.cores = cores;
  return c;
}

ClusterSpec uniformClusterSpec(const DeviceSpec& spec, int n, Link link, std::int64_t hostPool) {
  ClusterSpec c;
  c.name = std::to_string(n) + "x-" + spec.name;
  c.devices.assign(n, spec);
  c.links.assign(n, std::vector<Link>(n, link));
  c.linkKinds.assign(n, std::vector<std::string>(n, "default"));
  c.hostPool = hostPool;
  return c;
}

ClusterSpec parseClusterSpec(const std::string& yaml, const std::string& source,
                             const std::string& devicesDir) {
  YAML::Node n;
  try {
    n = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw UserError(source + ": not valid YAML: " + e.what());
  }
  if (!n.IsMap()) throw UserError(source + ": a cluster spec is a map of keys");
  checkKeys(n,
            {"name", "description", "devices", "host_pool", "link_kinds", "default_link", "matrix",
             "groups", "group_link", "cores", "processes"},
            source, "");
  ClusterSpec c;
  c.name = n["name"] ? n["name"].as<std::string>() : fs::path(source).stem().string();
  if (n["description"]) c.description = n["description"].as<std::string>();
  if (!n["devices"] || !n["devices"].IsSequence())
    throw UserError(source + ": 'devices' must be a list of {spec: <device>, count: <n>}");
  for (const auto& d : n["devices"]) {
    checkKeys(d, {"spec", "count", "memory"}, source, "devices.");
    if (!d["spec"]) throw UserError(where(source, d) + ": devices entry without 'spec'");
    DeviceSpec spec = findDeviceSpec(d["spec"].as<std::string>(), devicesDir);
    if (d["memory"]) {  // the spec's capacity overridden; `unlimited` as Setup's cpu domain
      const std::string t = d["memory"].as<std::string>();
      auto v = t == "unlimited" ? std::optional<std::int64_t>(std::int64_t(1) << 50) : parseSize(t);
      if (!v || *v <= 0)
        throw UserError(where(source, d["memory"]) +
                        ": devices.memory must be a size such as 16GiB or unlimited, got '" + t +
                        "'");
      spec.memory = *v;
    }
    int count = d["count"] ? d["count"].as<int>() : 1;
    if (count < 1) throw UserError(where(source, d) + ": devices.count must be >= 1");
    for (int i = 0; i < count; ++i) c.devices.push_back(spec);
  }
  const int D = static_cast<int>(c.devices.size());
  if (n["host_pool"]) {
    std::string t = n["host_pool"].as<std::string>();
    if (t != "unlimited") {
      auto v = parseSize(t);
      if (!v || *v <= 0)
        throw UserError(where(source, n["host_pool"]) +
                        ": host_pool must be a size such as 64GiB or unlimited, got '" + t + "'");
      c.hostPool = *v;
    }
  }
  if (n["cores"]) {
    int cores = -1;
    try {
      cores = n["cores"].as<int>();
    } catch (const YAML::Exception&) {
    }
    if (cores < 0)
      throw UserError(where(source, n["cores"]) +
                      ": cores must be an integer >= 0 (the cores the devices share; 0 = "
                      "each device has its own), got '" +
                      n["cores"].Scalar() + "'");
    c.cores = cores;
  }
  if (n["processes"]) {  // Note [Devices and processes]
    const YAML::Node& pn = n["processes"];
    const std::string allowed =
        ": processes must be one (every device in one process), per_device, or a list of "
        "device-index lists such as [[0, 1], [2, 3]] naming every device once";
    if (pn.IsScalar() && pn.Scalar() == "one") {
      c.processes.assign(D, 0);
    } else if (pn.IsScalar() && pn.Scalar() == "per_device") {
      for (int d = 0; d < D; ++d) c.processes.push_back(d);
    } else if (pn.IsSequence()) {
      c.processes.assign(D, -1);
      int g = 0;
      for (const auto& grp : pn) {
        if (!grp.IsSequence()) throw UserError(where(source, grp) + allowed);
        for (const auto& i : grp) {
          int d = -1;
          try {
            d = i.as<int>();
          } catch (const YAML::Exception&) {
          }
          if (d < 0 || d >= D || c.processes[d] >= 0)
            throw UserError(
                where(source, i) + ": processes: device '" + i.Scalar() + "' is " +
                (d >= 0 && d < D ? "listed twice" : "out of range 0.." + std::to_string(D - 1)) +
                allowed);
          c.processes[d] = g;
        }
        ++g;
      }
      for (int d = 0; d < D; ++d)
        if (c.processes[d] < 0)
          throw UserError(where(source, pn) + ": processes: device " + std::to_string(d) +
                          " is in no process" + allowed);
    } else {
      throw UserError(where(source, pn) + allowed + ", got '" + pn.Scalar() + "'");
    }
  }
  std::map<std::string, Link> kinds;
  if (n["link_kinds"]) {
    for (auto it = n["link_kinds"].begin(); it != n["link_kinds"].end(); ++it) {
      const std::string k = it->first.as<std::string>();
      checkKeys(it->second, {"bandwidth", "latency"}, source, "link_kinds." + k + ".");
      Link l;
      if (!it->second["bandwidth"])
        throw UserError(where(source, it->second) + ": link_kinds." + k + " needs a bandwidth");
      // `unlimited`: transfers take no time (Link::bandwidth 0), for compute-only clusters.
      const std::string bw = it->second["bandwidth"].as<std::string>();
      if (bw != "unlimited")
        l.bandwidth = parseBandwidth(bw, source + ": link_kinds." + k + ".bandwidth");
      if (it->second["latency"])
        l.latency = parseSeconds(it->second["latency"].as<std::string>(),
                                 source + ": link_kinds." + k + ".latency");
      kinds[k] = l;
    }
  }
  std::vector<std::string> kindNames;
  for (auto& [k, v] : kinds) kindNames.push_back(k);
  auto kind = [&](const std::string& k, const YAML::Node& at) {
    auto it = kinds.find(k);
    if (it == kinds.end())
      throw UserError(where(source, at) + ": unknown link kind '" + k + "'" +
                      didYouMean(k, kindNames) + "; allowed: " + joinAllowed(kindNames) +
                      " (declared under link_kinds)");
    return it->second;
  };
  std::string def = n["default_link"] ? n["default_link"].as<std::string>() : "";
  c.links.assign(D, std::vector<Link>(D));
  c.linkKinds.assign(D, std::vector<std::string>(D, "-"));
  if (!def.empty()) {
    Link l = kind(def, n["default_link"]);
    for (int a = 0; a < D; ++a)
      for (int b = 0; b < D; ++b)
        if (a != b) c.links[a][b] = l, c.linkKinds[a][b] = def;
  }
  // groups: lists of device indices (e.g. one per host); group_link joins different groups,
  // default_link joins devices within one.
  if (n["groups"]) {
    if (!n["group_link"]) throw UserError(source + ": 'groups' needs 'group_link'");
    const std::string gk = n["group_link"].as<std::string>();
    Link gl = kind(gk, n["group_link"]);
    std::vector<int> group(D, -1);
    int g = 0;
    for (const auto& grp : n["groups"]) {
      for (const auto& i : grp) {
        int d = i.as<int>();
        if (d < 0 || d >= D)
          throw UserError(where(source, i) + ": groups: device " + std::to_string(d) +
                          " out of range 0.." + std::to_string(D - 1));
        group[d] = g;
      }
      ++g;
    }
    for (int a = 0; a < D; ++a)
      for (int b = 0; b < D; ++b)
        if (a != b && group[a] != group[b]) c.links[a][b] = gl, c.linkKinds[a][b] = gk;
  }
  if (n["matrix"]) {
    const auto& m = n["matrix"];
    if (!m.IsSequence() || static_cast<int>(m.size()) != D)
      throw UserError(where(source, m) + ": matrix must have one row per device (" +
                      std::to_string(D) + ")");
    for (int a = 0; a < D; ++a) {
      if (!m[a].IsSequence() || static_cast<int>(m[a].size()) != D)
        throw UserError(where(source, m[a]) + ": matrix row " + std::to_string(a) + " must have " +
                        std::to_string(D) + " entries");
      for (int b = 0; b < D; ++b) {
        const std::string k = m[a][b].as<std::string>();
        if (a == b || k == "-") continue;
        c.links[a][b] = kind(k, m[a][b]);
        c.linkKinds[a][b] = k;
      }
    }
  }
  if (def.empty() && !n["matrix"] && D > 1)
    throw UserError(source + ": give default_link (a link kind) or a matrix of link kinds");
  for (int a = 0; a < D; ++a)
    for (int b = 0; b < D; ++b)
      if (a != b && c.linkKinds[a][b] == "-")
        throw UserError(source + ": no link from device " + std::to_string(a) + " to " +
                        std::to_string(b) + "; set default_link or fill the matrix");
  return c;
}

namespace {
// Doubles as text that reads back to the same double (%.17g).
std::string exact(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}
}  // namespace

std::string deviceSpecToYaml(const DeviceSpec& d) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << d.name;
  if (!d.description.empty()) out << YAML::Key << "description" << YAML::Value << d.description;
  out << YAML::Key << "peak_flops" << YAML::Value << exact(d.peakFlops);
  if (d.bf16Flops > 0) out << YAML::Key << "bf16_flops" << YAML::Value << exact(d.bf16Flops);
  if (d.fp16Flops > 0) out << YAML::Key << "fp16_flops" << YAML::Value << exact(d.fp16Flops);
  out << YAML::Key << "memory" << YAML::Value << std::to_string(d.memory);
  out << YAML::Key << "hbm_bandwidth" << YAML::Value << exact(d.hbmBandwidth);
  out << YAML::Key << "pcie_bandwidth" << YAML::Value << exact(d.pcieBandwidth);
  out << YAML::Key << "host_latency" << YAML::Value << exact(d.hostLatency);
  out << YAML::Key << "efficiency" << YAML::Value << exact(d.efficiency);
  out << YAML::Key << "layer_overhead" << YAML::Value << exact(d.layerOverhead);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string clusterSpecToYaml(const ClusterSpec& c) {
  const int D = static_cast<int>(c.devices.size());
  // One named kind per distinct link; the spec's own kind names where it has them.
  std::map<std::string, Link> kinds;
  std::vector<std::vector<std::string>> names(D, std::vector<std::string>(D, "-"));
  for (int a = 0; a < D; ++a)
    for (int b = 0; b < D; ++b) {
      if (a == b) continue;
      const Link& l = c.links[a][b];
      std::string k =
          a < static_cast<int>(c.linkKinds.size()) && b < static_cast<int>(c.linkKinds[a].size())
              ? c.linkKinds[a][b]
              : "";
      auto it = kinds.find(k);
      if (k.empty() || k == "-" || (it != kinds.end() && !(it->second == l))) {
        k.clear();
        for (auto& [name, link] : kinds)
          if (link == l) k = name;
        if (k.empty()) k = "link" + std::to_string(kinds.size());
      }
      kinds[k] = l;
      names[a][b] = k;
    }
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << c.name;
  if (!c.description.empty()) out << YAML::Key << "description" << YAML::Value << c.description;
  out << YAML::Key << "devices" << YAML::Value << YAML::BeginSeq;
  for (const auto& d : c.devices)
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "spec" << YAML::Value << d.name << YAML::Key
        << "count" << YAML::Value << 1 << YAML::Key << "memory" << YAML::Value
        << std::to_string(d.memory) << YAML::EndMap;  // the capacity, which may be overridden
  out << YAML::EndSeq;
  out << YAML::Key << "host_pool" << YAML::Value
      << (c.hostPool < 0 ? std::string("unlimited") : std::to_string(c.hostPool));
  if (c.cores > 0) out << YAML::Key << "cores" << YAML::Value << c.cores;
  if (static_cast<int>(c.processes.size()) == D &&
      std::any_of(c.processes.begin(), c.processes.end(),
                  [&](int p) { return p != c.processes[0]; })) {
    // Note [Devices and processes]: as groups of device indices, in order of first device.
    std::vector<int> order;
    std::map<int, std::vector<int>> groups;
    for (int d = 0; d < D; ++d) {
      if (!groups.count(c.processes[d])) order.push_back(c.processes[d]);
      groups[c.processes[d]].push_back(d);
    }
    out << YAML::Key << "processes" << YAML::Value << YAML::BeginSeq;
    for (int p : order) out << YAML::Flow << groups[p];
    out << YAML::EndSeq;
  }
  if (!kinds.empty()) {
    out << YAML::Key << "link_kinds" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, l] : kinds)
      out << YAML::Key << k << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key
          << "bandwidth" << YAML::Value
          << (l.bandwidth > 0 ? exact(l.bandwidth) : std::string("unlimited")) << YAML::Key
          << "latency" << YAML::Value << exact(l.latency) << YAML::EndMap;
    out << YAML::EndMap;
    out << YAML::Key << "matrix" << YAML::Value << YAML::BeginSeq;
    for (int a = 0; a < D; ++a) out << YAML::Flow << names[a];
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

ClusterSpec loadClusterSpec(const std::string& path, const std::string& devicesDir) {
  return parseClusterSpec(readFile(path, "cluster spec"), path, devicesDir);
}

}  // namespace pipefb::planner
