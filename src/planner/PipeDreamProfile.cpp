// PipeDream graph.txt -> pipefb profile (PipeDreamProfile.h, Note [PipeDream profiles]).
#include "pipefb/planner/PipeDreamProfile.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <sstream>

#include "pipefb/common/Error.h"

namespace pipefb::planner {

namespace {

const char* const kNodeFormat =
    "expected 'nodeN -- description -- forward_compute_time=<ms>, backward_compute_time=<ms>, "
    "activation_size=<bytes>, parameter_size=<bytes>' or an edge '\\tnodeA -- nodeB'";

std::vector<std::string> splitOn(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + sep.size();
  }
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

struct Parsed {
  std::string id, desc;
  double forwardMs = 0, backwardMs = 0, activation = 0, parameters = 0;
  int line = 0;
};

class LineError {
 public:
  LineError(std::string source, int line)
      : where_(std::move(source) + ":" + std::to_string(line)) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw UserError(where_ + ": " + what + "; " + kNodeFormat);
  }
  double number(const std::string& text, const std::string& key) const {
    try {
      size_t pos = 0;
      const double v = std::stod(text, &pos);
      if (pos == text.size() && v >= 0) return v;
    } catch (const std::exception&) {
    }
    fail(key + " must be a number >= 0, got '" + text + "'");
  }

 private:
  std::string where_;
};

// "key=value" with the expected key; activation_size may be "[a; b]" (its sum).
double field(const std::string& token, const std::string& key, const LineError& err) {
  const std::string t = trim(token);
  if (t.compare(0, key.size() + 1, key + "=") != 0)
    err.fail("expected " + key + "=..., got '" + t + "'");
  std::string value = t.substr(key.size() + 1);
  if (!value.empty() && value.front() == '[') {
    if (value.back() != ']') err.fail(key + " list without a closing ']'");
    double sum = 0;
    for (const auto& part : splitOn(value.substr(1, value.size() - 2), "; "))
      sum += err.number(trim(part), key);
    return sum;
  }
  return err.number(value, key);
}

// "node123" -> 123, for the node-number order; ids without a number keep the file order.
long nodeNumber(const std::string& id) {
  size_t d = id.size();
  while (d > 0 && std::isdigit(static_cast<unsigned char>(id[d - 1]))) --d;
  if (d == id.size() || id.size() - d > 15) return -1;
  return std::stol(id.substr(d));
}

bool startsWith(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

}  // namespace

bool isPipeDreamGraph(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (trim(line).empty()) continue;
    return line.find(" -- ") != std::string::npos &&
           line.find("forward_compute_time=") != std::string::npos;
  }
  return false;
}

PipeDreamGraph parsePipeDreamGraph(const std::string& text, const std::string& source) {
  std::vector<Parsed> nodes;
  std::map<std::string, int> byId;
  std::vector<std::pair<int, int>> edges;  // (from, to) file indices
  std::istringstream in(text);
  std::string raw;
  int lineNo = 0;
  while (std::getline(in, raw)) {
    ++lineNo;
    const LineError err(source, lineNo);
    if (trim(raw).empty()) continue;
    if (raw[0] == '\t') {
      const auto ends = splitOn(trim(raw), " -- ");
      if (ends.size() != 2) err.fail("an edge names two nodes");
      int at[2];
      for (int k = 0; k < 2; ++k) {
        auto it = byId.find(trim(ends[k]));
        if (it == byId.end())
          err.fail("edge to or from '" + trim(ends[k]) + "', which no node line above defines");
        at[k] = it->second;
      }
      if (at[0] == at[1]) err.fail("an edge from a node to itself");
      edges.emplace_back(at[0], at[1]);
      continue;
    }
    auto tokens = splitOn(trim(raw), " -- ");
    // id -- description (which may itself hold " -- ") -- metadata [-- stage_id=N]
    size_t meta = tokens.size();
    for (size_t k = 1; k < tokens.size(); ++k)
      if (startsWith(trim(tokens[k]), "forward_compute_time=")) meta = k;
    if (tokens.size() < 3 || meta == tokens.size() || meta < 2) err.fail("not a node line");
    if (meta + 1 < tokens.size() && !startsWith(trim(tokens[meta + 1]), "stage_id="))
      err.fail("unexpected '" + tokens[meta + 1] + "' after the node's metadata");
    Parsed p;
    p.line = lineNo;
    p.id = trim(tokens[0]);
    for (size_t k = 1; k < meta; ++k) p.desc += (k > 1 ? " -- " : "") + tokens[k];
    const auto f = splitOn(tokens[meta], ", ");
    if (f.size() != 4)
      err.fail("the metadata has 4 comma-separated fields, got " + std::to_string(f.size()));
    p.forwardMs = field(f[0], "forward_compute_time", err);
    p.backwardMs = field(f[1], "backward_compute_time", err);
    p.activation = field(f[2], "activation_size", err);
    p.parameters = field(f[3], "parameter_size", err);
    if (!byId.emplace(p.id, static_cast<int>(nodes.size())).second)
      err.fail("node '" + p.id + "' is defined twice");
    nodes.push_back(p);
  }
  if (nodes.empty()) throw UserError(source + ": a PipeDream graph without nodes");

  // Node-number order (the profiled forward pass); then PipeDream's own clean-up: Input
  // sources carry no cost and are the model input; unused __getitem__ sinks go.
  std::vector<int> byNumber(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) byNumber[i] = static_cast<int>(i);
  std::stable_sort(byNumber.begin(), byNumber.end(), [&](int a, int b) {
    const long na = nodeNumber(nodes[a].id), nb = nodeNumber(nodes[b].id);
    if ((na < 0) != (nb < 0)) return nb < 0;
    return na < nb;
  });
  std::vector<int> outDegree(nodes.size(), 0), inDegree(nodes.size(), 0);
  for (auto [a, b] : edges) ++outDegree[a], ++inDegree[b];
  std::vector<bool> isInput(nodes.size()), dropped(nodes.size());
  PipeDreamGraph g;
  for (size_t i = 0; i < nodes.size(); ++i) {
    isInput[i] = inDegree[i] == 0 && startsWith(nodes[i].desc, "Input");
    dropped[i] = outDegree[i] == 0 && startsWith(nodes[i].desc, "__getitem__");
    if (isInput[i]) {
      g.inputBytes += static_cast<std::int64_t>(nodes[i].activation);
      ++g.inputNodes;
    }
  }
  std::vector<int> index(nodes.size(), -1);
  LayerDag& dag = g.dag;
  for (int i : byNumber) {
    if (isInput[i] || dropped[i]) continue;
    index[i] = dag.size();
    LayerCost c;
    c.name = nodes[i].id + " " + nodes[i].desc.substr(0, nodes[i].desc.find('('));
    c.forward = nodes[i].forwardMs / 1000.0;
    c.backward = nodes[i].backwardMs / 1000.0;
    c.recompute = c.forward;
    c.outputBytes = static_cast<std::int64_t>(nodes[i].activation);
    c.savedBytes = c.outputBytes;
    c.workingBytes = c.outputBytes;
    c.paramBytes = static_cast<std::int64_t>(nodes[i].parameters);
    c.gradBytes = c.paramBytes;
    dag.nodes.push_back(c);
  }
  if (dag.size() == 0)
    throw UserError(source + ": a PipeDream graph with no node besides its inputs");
  dag.successors.assign(dag.size(), {});
  dag.inputBytes = g.inputBytes;
  for (auto [a, b] : edges) {
    if (index[b] < 0) continue;  // into a dropped sink
    if (isInput[a]) {
      if (std::find(dag.inputConsumers.begin(), dag.inputConsumers.end(), index[b]) ==
          dag.inputConsumers.end())
        dag.inputConsumers.push_back(index[b]);
    } else if (index[a] >= 0) {
      auto& succ = dag.successors[index[a]];
      if (std::find(succ.begin(), succ.end(), index[b]) == succ.end()) succ.push_back(index[b]);
    }
  }
  return g;
}

Profile importPipeDreamProfile(const std::string& text, const std::string& source,
                               const PipeDreamImport& options) {
  PipeDreamGraph g = parsePipeDreamGraph(text, source);
  Profile p;
  std::int64_t batch = options.batch;
  if (batch <= 0) {
    // One fp32 image of the shapes PipeDream profiled: 3x224x224 (VGG, ResNet) or
    // 3x299x299 (Inception-v3); exactly one must divide the Input activation.
    std::vector<std::int64_t> fits;
    for (std::int64_t side : {224, 299}) {
      const std::int64_t image = 4 * 3 * side * side;
      if (g.inputBytes > 0 && g.inputBytes % image == 0) fits.push_back(g.inputBytes / image);
    }
    if (g.inputNodes == 0 || fits.size() != 1)
      throw UserError(source + ": cannot infer the profiling batch from " +
                      (g.inputNodes == 0
                           ? std::string("a graph without an Input node")
                           : "an Input activation of " + std::to_string(g.inputBytes) +
                                 " bytes (not a whole number of one 3x224x224 or "
                                 "3x299x299 fp32 image)") +
                      "; give it with --profile-batch N");
    batch = fits.front();
  }
  for (auto& c : g.dag.nodes) {
    c.optimizerBytes = options.optimizer.statesPerParam * c.paramBytes;
    c.stepWorkingBytes = options.optimizer.stepTransients * c.paramBytes;
  }
  const std::string dir = std::filesystem::path(source).parent_path().filename().string();
  p.model = "pipedream " + (dir.empty() ? std::filesystem::path(source).stem().string() : dir);
  p.device = options.device;
  p.source = "pipedream";
  p.microbatch = batch;
  return linearize(g.dag, topologicalOrder(g.dag, source), p);
}

}  // namespace pipefb::planner
