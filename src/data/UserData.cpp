// The user's own data (issue 34, part 4): tensors saved from Python and token files.
//
// Note [Tensors from Python]
// data.name: tensors reads a file written by `torch.save({"x": X, "y": Y}, path)` with
// LibTorch's own unpickler (torch::pickle_load, the zip format torch.save writes). X holds
// the samples along its first dimension, shaped as one model input each: (N, C, H, W)
// floats for an image model, (N, T) integer tokens for a token model; Y the targets: (N)
// class ids, or (N, T) next tokens. Floating X becomes float32 and integer Y int64 once at
// load; a shape, dtype or length that does not fit the model exits 2 naming the file.
//
// Note [Token files]
// data.name: tokens reads the layouts nanoGPT and llm.c write: raw uint16 tokens
// (nanoGPT's train.bin, np.memmap uint16), or llm.c's header of 256 int32 (magic 20240520,
// version 1, the token count) before uint16 tokens. A sample is a window of
// model.input_size + 1 tokens; window i starts at token i x input_size, so consecutive
// windows share one token and every token but the first is a target once. The input is
// its first T tokens, the target its last T.
#include "UserData.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "Samples.h"
#include "pipefb/common/Error.h"

namespace pipefb::data {
namespace fs = std::filesystem;
using detail::capped;
using detail::indexTensor;
using detail::isTokenModel;
using detail::splitName;

namespace {

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::int32_t kLlmcVersion = 1;
constexpr std::int64_t kLlmcHeaderInts = 256;

/// The file of `split`: data.path, or data.test_path for the test split.
std::string fileOf(const DataOptions& data, Split split, const char* name) {
  const std::string& path = split == Split::Train ? data.path : data.test_path;
  const char* key = split == Split::Train ? "data.path" : "data.test_path";
  if (path.empty())
    throw UserError(std::string(key) + " is empty: data.name " + name + " needs a file" +
                    (split == Split::Test ? " for the test split (or training.eval: false)" : ""));
  if (!fs::is_regular_file(path))
    throw UserError(std::string(key) + ": '" + path + "' is not a file (data.name " + name + ")");
  return path;
}

std::vector<char> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot be read");
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

std::string shapeText(at::IntArrayRef s) {
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ")";
  return o.str();
}

class TensorPairs : public Dataset {
 public:
  TensorPairs(torch::Tensor x, torch::Tensor y, std::int64_t classes, std::string how)
      : x_(std::move(x)), y_(std::move(y)), classes_(classes), how_(std::move(how)) {}
  std::int64_t size() const override { return x_.size(0); }
  std::int64_t numClasses() const override { return classes_; }
  std::string describe() const override { return how_; }
  Batch get(const std::vector<std::int64_t>& indices) const override {
    const torch::Tensor i = indexTensor(indices, size());
    return {x_.index_select(0, i), y_.index_select(0, i)};
  }

 private:
  torch::Tensor x_, y_;
  std::int64_t classes_;
  std::string how_;
};

torch::Tensor entry(const c10::impl::GenericDict& dict, const std::string& key,
                    const std::string& path) {
  const auto it = dict.find(c10::IValue(key));
  if (it == dict.end() || !it->value().isTensor())
    throw UserError(path + ": no tensor under \"" + key +
                    "\"; expected a dict written by torch.save({\"x\": X, \"y\": Y}, path)");
  return it->value().toTensor();
}

class TokenWindows : public Dataset {
 public:
  TokenWindows(torch::Tensor tokens, std::int64_t t, std::int64_t n, std::int64_t vocab,
               std::string how)
      : tokens_(std::move(tokens)), t_(t), n_(n), vocab_(vocab), how_(std::move(how)) {}
  std::int64_t size() const override { return n_; }
  std::int64_t numClasses() const override { return vocab_; }
  std::string describe() const override { return how_; }
  Batch get(const std::vector<std::int64_t>& indices) const override {
    std::vector<torch::Tensor> rows;
    rows.reserve(indices.size());
    for (std::int64_t i : indices) {
      PIPEFB_ASSERT(i >= 0 && i < n_, "sample index " << i << " of " << n_);
      rows.push_back(tokens_.slice(0, i * t_, i * t_ + t_ + 1));
    }
    const torch::Tensor s = torch::stack(rows).to(torch::kLong);  // (B, T+1)
    return {s.slice(1, 0, t_).contiguous(), s.slice(1, 1, t_ + 1).contiguous()};
  }

 private:
  torch::Tensor tokens_;  // (N) int32
  std::int64_t t_, n_, vocab_;
  std::string how_;
};

}  // namespace

std::shared_ptr<Dataset> loadTensors(const DataOptions& data, const model::ModelOptions& model,
                                     Split split) {
  const std::string path = fileOf(data, split, "tensors");
  c10::IValue v;
  try {
    v = torch::pickle_load(readFile(path));
  } catch (const c10::Error&) {
    throw UserError(path +
                    ": not a file torch.save wrote (expected its zip archive of a dict, "
                    "torch.save({\"x\": X, \"y\": Y}, path))");
  }
  if (!v.isGenericDict())
    throw UserError(path + ": holds a " + v.tagKind() +
                    ", not a dict; expected torch.save({\"x\": X, \"y\": Y}, path)");
  const auto dict = v.toGenericDict();
  torch::Tensor x = entry(dict, "x", path), y = entry(dict, "y", path);
  x = x.detach();
  y = y.detach();
  if (x.dim() < 1 || y.dim() < 1 || x.size(0) != y.size(0))
    throw UserError(path + ": \"x\" " + shapeText(x.sizes()) + " and \"y\" " +
                    shapeText(y.sizes()) + " hold different numbers of samples (dimension 0)");
  if (x.size(0) == 0) throw UserError(path + ": \"x\" and \"y\" hold no samples");
  const bool tokens = isTokenModel(model);
  const std::vector<std::int64_t> want = model::sampleShape(model);
  const auto sample = x.sizes().slice(1);
  if (std::vector<std::int64_t>(sample.begin(), sample.end()) != want)
    throw UserError(path + ": a sample of \"x\" is " + shapeText(sample) + " but model " +
                    model.name + " takes " + shapeText(want) +
                    (model.name == "torchscript" ? " (model.sample_shape)"
                     : tokens                    ? " (model.input_size)"
                              : " (model.channels, model.input_size, model.input_size)"));
  if (tokens ? x.is_floating_point() : !x.is_floating_point())
    throw UserError(path + ": \"x\" is " + std::string(c10::toString(x.scalar_type())) +
                    "; model " + model.name + " takes " +
                    (tokens ? "integer token ids" : "floating-point samples"));
  if (y.is_floating_point() || y.scalar_type() == torch::kBool)
    throw UserError(path + ": \"y\" is " + std::string(c10::toString(y.scalar_type())) +
                    "; targets are integer class ids");
  const auto ySample = y.sizes().slice(1);
  const std::vector<std::int64_t> wantY =
      tokens ? std::vector<std::int64_t>{model.input_size} : std::vector<std::int64_t>{};
  if (std::vector<std::int64_t>(ySample.begin(), ySample.end()) != wantY)
    throw UserError(path + ": a target of \"y\" is " + shapeText(ySample) + ", expected " +
                    shapeText(wantY) + (tokens ? " (the next token of each position)" : ""));
  x = x.to(tokens                                                          ? torch::kLong
           : model.input_dtype == "float64" && model.name == "torchscript" ? torch::kDouble
                                                                           : torch::kFloat)
          .contiguous();
  y = y.to(torch::kLong).contiguous();
  const std::int64_t lo = std::min(y.min().item<std::int64_t>(),
                                   tokens ? x.min().item<std::int64_t>() : std::int64_t{0});
  const std::int64_t hi = std::max(y.max().item<std::int64_t>(),
                                   tokens ? x.max().item<std::int64_t>() : std::int64_t{0});
  if (lo < 0 || hi >= model.num_classes)
    throw UserError(path + ": ids from " + std::to_string(lo) + " to " + std::to_string(hi) +
                    " do not fit model.num_classes " + std::to_string(model.num_classes) +
                    " (allowed: 0.." + std::to_string(model.num_classes - 1) + ")");
  const std::int64_t n =
      capped(x.size(0), split == Split::Train ? data.limit_train : data.limit_test);
  x = x.slice(0, 0, n);
  y = y.slice(0, 0, n);
  std::ostringstream how;
  how << "tensors " << splitName(split) << ": " << n << " samples " << shapeText(sample) << " from "
      << path;
  return std::make_shared<TensorPairs>(x, y, model.num_classes, how.str());
}

std::shared_ptr<Dataset> loadTokens(const DataOptions& data, const model::ModelOptions& model,
                                    Split split) {
  const std::string path = fileOf(data, split, "tokens");
  if (!isTokenModel(model))
    throw UserError(
        "data.name: tokens feeds a token model (gpt2, or torchscript with "
        "model.input_dtype int64), not " +
        model.name);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw UserError(path + ": cannot be read");
  const std::int64_t size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0);
  std::int64_t offset = 0;
  std::string layout = "raw uint16 (nanoGPT)";
  std::int32_t head[3] = {0, 0, 0};
  if (size >= static_cast<std::int64_t>(sizeof head))
    in.read(reinterpret_cast<char*>(head), sizeof head);
  if (head[0] == kLlmcMagic) {
    const std::int64_t headerBytes = kLlmcHeaderInts * 4;
    if (size < headerBytes)
      throw UserError(path + ": llm.c header (magic " + std::to_string(kLlmcMagic) +
                      ") is cut short: " + std::to_string(size) + " of " +
                      std::to_string(headerBytes) + " bytes");
    if (head[1] != kLlmcVersion)
      throw UserError(path + ": llm.c token file version " + std::to_string(head[1]) +
                      "; allowed: 1 (uint16 tokens)");
    const std::int64_t body = size - headerBytes;
    if (head[2] < 0 || body != 2 * static_cast<std::int64_t>(head[2]))
      throw UserError(path + ": llm.c header says " + std::to_string(head[2]) +
                      " tokens but the file holds " + std::to_string(body) +
                      " bytes after its 1024-byte header (2 a token)");
    offset = headerBytes;
    layout = "llm.c (header, uint16)";
  } else if (size % 2 != 0) {
    throw UserError(path + ": " + std::to_string(size) +
                    " bytes is not a whole number of uint16 tokens, and it has no llm.c header "
                    "(magic " +
                    std::to_string(kLlmcMagic) + ")");
  }
  const std::int64_t count = (size - offset) / 2;
  const std::int64_t t = model.input_size;
  if (count < t + 1)
    throw UserError(path + ": " + std::to_string(count) + " tokens, fewer than one sample of " +
                    std::to_string(t + 1) + " (model.input_size + 1)");
  // Read straight into the tokens' storage (little-endian uint16, as both layouts write).
  std::vector<std::uint16_t> raw(static_cast<size_t>(count));
  in.seekg(offset);
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(2 * count)))
    throw UserError(path + ": read failed after byte " + std::to_string(offset));
  const std::uint16_t top = *std::max_element(raw.begin(), raw.end());
  if (top >= model.num_classes)
    throw UserError(path + ": token id " + std::to_string(top) +
                    " does not fit model.num_classes " + std::to_string(model.num_classes) +
                    " (the vocabulary size)");
  torch::Tensor tokens = torch::empty({count}, torch::kInt);
  std::int32_t* p = tokens.data_ptr<std::int32_t>();
  for (std::int64_t i = 0; i < count; ++i) p[i] = raw[static_cast<size_t>(i)];
  const std::int64_t n =
      capped((count - 1) / t, split == Split::Train ? data.limit_train : data.limit_test);
  std::ostringstream how;
  how << "tokens " << splitName(split) << ": " << count << " tokens from " << path << " (" << layout
      << "), " << n << " windows of " << t + 1;
  return std::make_shared<TokenWindows>(tokens, t, n, model.num_classes, how.str());
}

}  // namespace pipefb::data
