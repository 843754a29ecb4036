#include "pipefb/train/Checkpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipefb/common/Error.h"

namespace pipefb::train {

namespace {
std::string pickled(const NamedTensors& tensors);
NamedTensors unpickled(const std::string& bytes, const std::string& path);
}  // namespace

void saveStateDict(const std::string& path, const NamedTensors& tensors) {
  writeFileAtomically(path, pickled(tensors));
}

NamedTensors loadStateDict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open checkpoint (does it exist?)");
  return unpickled(
      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), path);
}

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "pipefb-checkpoint";

std::string stepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

// The step of a "step-000040" folder name, -1 for anything else.
int64_t stepOfDir(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// Note [Plain pickles]
// torch.load reads with weights_only=True by default (PyTorch 2.6 on), which refuses the
// type tag that torch::pickle_save puts on a typed c10::Dict
// (torch.jit._pickle.restore_type_tag). So the dict is pickled untagged, as a plain dict
// of tensors, into the same zip archive (data.pkl beside data/N); torch::pickle_load and
// Python's torch.load both read it as is.
std::string pickled(const NamedTensors& tensors) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().cpu().contiguous());
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* buf, size_t n) { pickle.append(buf, n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    archive.append(static_cast<const char*>(data), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

NamedTensors unpickled(const std::string& bytes, const std::string& path) {
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw UserError(path + ": not a readable checkpoint (" + why.substr(0, 120) + ")");
  }
  if (!value.isGenericDict()) throw UserError(path + ": checkpoint is not a dict of tensors");
  NamedTensors out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor())
      throw UserError(path + ": checkpoint entry is not a (name, tensor) pair");
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::pair<int64_t, fs::path>> stepDirs(const std::string& runDir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  fs::path root = checkpointsDir(runDir);
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    int64_t step = stepOfDir(e.path().filename().string());
    if (step >= 0 && e.is_directory()) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

uint32_t crc32Of(const std::string& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // zlib takes uInt lengths
    uInt n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

std::string checkpointsDir(const std::string& runDir) { return runDir + "/checkpoints"; }

std::string writeCheckpoint(const std::string& runDir, const CheckpointState& s, int64_t keep,
                            const std::function<void()>& beforeManifest) {
  const fs::path dir = fs::path(checkpointsDir(runDir)) / stepDirName(s.step);
  std::error_code ec;
  fs::remove(dir / kManifest, ec);  // re-taking a step: it is incomplete until the end
  fs::create_directories(dir);
  json files = json::array();
  auto put = [&](const std::string& name, const std::string& bytes) {
    writeFileAtomically((dir / name).string(), bytes);
    files.push_back({{"name", name}, {"bytes", bytes.size()}, {"crc32", crc32Of(bytes)}});
  };
  put("model.pt", pickled(s.model));
  put("optimizer.pt", pickled(s.optimizer));
  put("rng.pt", pickled({{"torch", s.torchRng}}));

  json stages = json::array();
  for (const auto& st : s.stages)
    stages.push_back({{"layers", {st.first, st.last}},
                      {"forward_device", st.forwardDevice},
                      {"backward_device", st.backwardDevice},
                      {"weight_version", st.weightVersion},
                      {"names", st.names}});
  json m = {
      {"format", kFormat},
      {"version", 1},
      {"step", s.step},
      {"total_steps", s.totalSteps},
      {"loss", std::isfinite(s.loss) ? json(s.loss) : json(nullptr)},
      {"loader",
       {{"epoch", s.loaderEpoch}, {"position", s.loaderPosition}, {"seed", s.loaderSeed}}},
      {"rng", {{"torch", "rng.pt"}, {"loader", "a function of (loader.seed, loader.epoch)"}}},
      {"plan", {{"schedule", s.schedule}, {"microbatches", s.microbatches}, {"stages", stages}}},
      {"config", s.configYaml},
      {"files", files}};
  if (s.lossScale)
    m["loss_scale"] = {{"scale", s.lossScale->scale},
                       {"good_steps", s.lossScale->goodSteps},
                       {"skipped", s.lossScale->skipped}};
  if (beforeManifest) beforeManifest();
  // Last: the checkpoint exists once this rename is durable (Note [Checkpoint layout]).
  writeFileAtomically((dir / kManifest).string(), m.dump(1) + "\n");

  // Keep the newest `keep` complete checkpoints; drop older ones and older leftovers of
  // checkpoints that died mid-write.
  auto all = stepDirs(runDir);
  int64_t kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->first > s.step) continue;  // not ours to judge
    const bool complete = fs::exists(it->second / kManifest);
    if (complete && kept < keep) {
      ++kept;
      continue;
    }
    fs::remove_all(it->second, ec);
  }
  return dir.string();
}

std::string latestCheckpoint(const std::string& runDir) {
  auto all = stepDirs(runDir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (fs::exists(it->second / kManifest)) return it->second.string();
  return "";
}

CheckpointState readCheckpoint(const std::string& dirText) {
  const fs::path dir(dirText);
  const std::string mpath = (dir / kManifest).string();
  if (!fs::exists(mpath))
    throw UserError(mpath + ": missing; the checkpoint is incomplete (it died mid-write)");
  json m;
  try {
    m = json::parse(readAll(mpath));
  } catch (const json::exception& e) {
    throw UserError(mpath + ": not valid JSON (" + std::string(e.what()).substr(0, 100) +
                    "); the checkpoint is corrupt");
  }
  CheckpointState s;
  std::map<std::string, std::string> bytesOf;
  try {
    if (!m.is_object() || m.value("format", "") != kFormat)
      throw UserError(mpath + ": not a pipefb checkpoint manifest (format is not '" +
                      std::string(kFormat) + "')");
    if (m.at("version").get<int>() != 1)
      throw UserError(mpath + ": version " + m.at("version").dump() + " is not known; allowed: 1");
    s.step = m.at("step").get<int64_t>();
    s.totalSteps = m.at("total_steps").get<int64_t>();
    s.loss = m.at("loss").is_null() ? NAN : m.at("loss").get<double>();
    s.loaderEpoch = m.at("loader").at("epoch").get<int64_t>();
    s.loaderPosition = m.at("loader").at("position").get<int64_t>();
    s.loaderSeed = m.at("loader").at("seed").get<uint64_t>();
    if (m.contains("loss_scale")) {
      const json& l = m.at("loss_scale");
      s.lossScale = LossScale{l.at("scale").get<double>(), l.at("good_steps").get<int64_t>(),
                              l.at("skipped").get<int64_t>()};
    }
    s.configYaml = m.at("config").get<std::string>();
    s.schedule = m.at("plan").at("schedule").get<std::string>();
    s.microbatches = m.at("plan").at("microbatches").get<int64_t>();
    for (const auto& st : m.at("plan").at("stages")) {
      CheckpointStage c;
      c.first = st.at("layers").at(0).get<int64_t>();
      c.last = st.at("layers").at(1).get<int64_t>();
      c.forwardDevice = st.at("forward_device").get<int>();
      c.backwardDevice = st.at("backward_device").get<int>();
      c.weightVersion = st.at("weight_version").get<int64_t>();
      c.names = st.at("names").get<std::vector<std::string>>();
      s.stages.push_back(std::move(c));
    }
    for (const auto& f : m.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      if (name.find('/') != std::string::npos || name.find("..") != std::string::npos)
        throw UserError(mpath + ": file name '" + name + "' leaves the checkpoint folder");
      const std::string path = (dir / name).string();
      if (!fs::exists(path))
        throw UserError(path + ": missing, but the manifest lists it; the checkpoint is corrupt");
      std::string bytes = readAll(path);
      const auto want = f.at("bytes").get<uint64_t>();
      if (bytes.size() != want)
        throw UserError(path + ": " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                        std::to_string(want) +
                        " (truncated or overwritten); the checkpoint is corrupt");
      if (crc32Of(bytes) != f.at("crc32").get<uint32_t>())
        throw UserError(path +
                        ": CRC-32 does not match the manifest (garbled); the checkpoint is "
                        "corrupt");
      bytesOf[name] = std::move(bytes);
    }
  } catch (const json::exception& e) {
    throw UserError(mpath + ": malformed manifest (" + std::string(e.what()).substr(0, 100) + ")");
  }
  for (const char* need : {"model.pt", "optimizer.pt", "rng.pt"})
    if (!bytesOf.count(need))
      throw UserError(mpath + ": does not list " + std::string(need) +
                      "; the checkpoint is corrupt");
  s.model = unpickled(bytesOf["model.pt"], (dir / "model.pt").string());
  s.optimizer = unpickled(bytesOf["optimizer.pt"], (dir / "optimizer.pt").string());
  for (auto& [k, t] : unpickled(bytesOf["rng.pt"], (dir / "rng.pt").string()))
    if (k == "torch") s.torchRng = t;
  if (!s.torchRng.defined())
    throw UserError((dir / "rng.pt").string() + ": no 'torch' generator state");
  return s;
}

}  // namespace pipefb::train
