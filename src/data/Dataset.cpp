#include "pipefb/data/Dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "Random.h"
#include "Samples.h"
#include "UserData.h"
#include "pipefb/common/Error.h"
#include "pipefb/data/Readers.h"

// Note [Image shaping]
// Stored images go through, once and on the whole tensor:
//   uint8 (N, Cs, H, W) -> float / 255 -> channel adaption (3 -> 1 by the mean
//   of the channels) -> zero padding, centred, when the model's side S exceeds
//   H and W by at most 8 px -> normalisation with the data set's mean and std.
// Padding is done in raw pixel space, so the border looks like the black
// background of Fashion-MNIST (and becomes -mean/std after normalisation), as
// torchvision's Pad + ToTensor + Normalize would give.
// Two steps are left to get(), per batch, because on the whole set they would
// multiply its memory: repeating 1 channel to C (expand), and the bilinear
// resize to S x S when padding does not apply (S < H, or S - H > 8). Bilinear
// interpolation is affine with weights summing to one, so resizing after the
// normalisation gives the same values as resizing before it.

namespace pipefb::data {
namespace fs = std::filesystem;
using detail::capped;
using detail::indexTensor;
using detail::isTokenModel;
using detail::mixSeed;
using detail::splitName;
using detail::squareImages;
using detail::uniformBelow;

namespace {

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kMaxPad = 8;

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

struct ImageStats {
  std::vector<double> mean, std;
};

/// Bilinear resize of (B, C, h, w) to (B, C, side, side).
torch::Tensor resizeTo(const torch::Tensor& x, int64_t side) {
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{side, side})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

/// Real images (Fashion-MNIST, CIFAR-10), stored as in Note [Image shaping].
class ImageDataset : public Dataset {
 public:
  ImageDataset(torch::Tensor images, torch::Tensor labels, int64_t channels, int64_t side,
               int64_t numClasses, std::string description)
      : images_(std::move(images)),
        labels_(std::move(labels)),
        channels_(channels),
        side_(side),
        numClasses_(numClasses),
        description_(std::move(description)) {}

  int64_t size() const override { return labels_.size(0); }
  int64_t numClasses() const override { return numClasses_; }
  std::string describe() const override { return description_; }

  Batch get(const std::vector<int64_t>& indices) const override {
    torch::Tensor idx = indexTensor(indices, size());
    torch::Tensor x = images_.index_select(0, idx);  // (B, Cs, h, w)
    if (x.size(2) != side_ || x.size(3) != side_) x = resizeTo(x, side_);
    if (x.size(1) != channels_) x = x.expand({-1, channels_, -1, -1}).contiguous();
    return {x, labels_.index_select(0, idx)};
  }

 private:
  torch::Tensor images_;  // (N, Cs, h, w) float, Cs in {1, C}
  torch::Tensor labels_;  // (N) long
  int64_t channels_, side_, numClasses_;
  std::string description_;
};

/// uint8 (N, Cs, H, W) -> the stored float tensor of Note [Image shaping].
/// Appends what was done to `how` for describe(). Memory passes are kept few
/// (this runs on 47M pixels): one allocation of the padded result, one
/// converting copy into its centre, then scale and shift in place, which also
/// turns the zero border into the normalised background.
torch::Tensor shapeImages(const torch::Tensor& raw, ImageStats stats, const std::string& dataName,
                          const model::ModelOptions& model, bool normalize, std::ostream& how) {
  const int64_t n = raw.size(0), cs = raw.size(1), h = raw.size(2), w = raw.size(3);
  const int64_t c = model.channels, side = model.input_size;
  torch::Tensor x = raw;  // uint8 0..255, or float 0..255 after the grey conversion
  how << cs << "×" << h << "×" << w << " -> " << c << "×" << side << "×" << side;
  if (cs != c) {
    if (cs == 3 && c == 1) {
      x = raw.to(torch::kFloat).mean(1, /*keepdim=*/true);
      // Mean of the grey image is exact; its std is approximated by the mean of
      // the channel stds (the channels are strongly correlated).
      double m = (stats.mean[0] + stats.mean[1] + stats.mean[2]) / 3.0;
      double s = (stats.std[0] + stats.std[1] + stats.std[2]) / 3.0;
      stats = {{m}, {s}};
      how << " (grey = mean of RGB)";
    } else if (cs == 1) {
      how << " (channel repeated)";
    } else {
      std::ostringstream os;
      os << "model.channels = " << c << " does not fit " << dataName << ", which has " << cs
         << " channels; allowed model.channels: 1 or " << cs;
      throw UserError(os.str());
    }
  }
  const int64_t k = x.size(1);
  const int64_t dh = side - h, dw = side - w;
  const bool pad = dh >= 0 && dw >= 0 && dh <= kMaxPad && dw <= kMaxPad && (dh > 0 || dw > 0);
  torch::Tensor out;
  if (pad) {
    out = torch::zeros({n, k, side, side}, torch::kFloat);
    out.slice(2, dh / 2, dh / 2 + h).slice(3, dw / 2, dw / 2 + w).copy_(x);
    how << " (zero-padded " << dh / 2 << "/" << dh - dh / 2 << " px)";
  } else {
    out = torch::empty({n, k, h, w}, torch::kFloat);
    out.copy_(x);
    if (dh != 0 || dw != 0) how << " (bilinear resize per batch)";
  }
  if (normalize) {
    PIPEFB_ASSERT(static_cast<int64_t>(stats.mean.size()) == k,
                  "stats for " << stats.mean.size() << " channels, images have " << k);
    // (x / 255 - mean) / std = x * scale + shift, per channel.
    std::vector<double> scale(k), shift(k);
    for (int64_t i = 0; i < k; ++i) {
      scale[i] = 1.0 / (255.0 * stats.std[i]);
      shift[i] = -stats.mean[i] / stats.std[i];
    }
    out.mul_(torch::tensor(scale, torch::kDouble).to(torch::kFloat).view({1, k, 1, 1}))
        .add_(torch::tensor(shift, torch::kDouble).to(torch::kFloat).view({1, k, 1, 1}));
    how << ", normalised (mean " << std::fixed << std::setprecision(4);
    for (int64_t i = 0; i < k; ++i) how << (i ? "/" : "") << stats.mean[i];
    how << ", std ";
    for (int64_t i = 0; i < k; ++i) how << (i ? "/" : "") << stats.std[i];
    how << ")";
  } else {
    out.mul_(1.0 / 255.0);
    how << ", scaled to [0,1]";
  }
  return out;
}

void requireImageModel(const DataOptions& data, const model::ModelOptions& model) {
  if (isTokenModel(model)) {
    throw UserError("data.name = '" + data.name + "' gives images, but model.name = '" +
                    model.name + "' takes tokens; use data.name=synthetic for " + model.name);
  }
  if (model.name == "torchscript" && model.input_dtype == "float64")
    throw UserError("data.name = '" + data.name +
                    "' gives float32 images; model.input_dtype float64 takes data.name tensors "
                    "or synthetic");
  if (!squareImages(model)) {
    std::string shape;
    for (int64_t d : model.sample_shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    throw UserError("data.name = '" + data.name +
                    "' gives images [C, H, H], but model.sample_shape is [" + shape +
                    "]; use data.name tensors or synthetic");
  }
}

void requireClasses(const std::string& dataName, int64_t classes, const model::ModelOptions& m) {
  if (m.num_classes < classes) {
    throw UserError("model.num_classes = " + std::to_string(m.num_classes) + " but " + dataName +
                    " has " + std::to_string(classes) +
                    " classes; set model.num_classes=" + std::to_string(classes));
  }
}

// ---------------------------------------------------------------- Fashion-MNIST

std::shared_ptr<Dataset> loadFashionMnist(const DataOptions& data, const model::ModelOptions& model,
                                          Split split) {
  constexpr int64_t kClasses = 10;
  requireImageModel(data, model);
  requireClasses("fashion-mnist", kClasses, model);
  const fs::path dir = data.path.empty() ? fs::path(kFashionDir) : fs::path(data.path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw UserError("data.path '" + dir.string() +
                    "' is not a folder (fashion-mnist) ---> HINT: apt-get install "
                    "dataset-fashion-mnist, or set data.path to a folder holding "
                    "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz");
  }
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string imagesPath = (dir / (prefix + "-images-idx3-ubyte.gz")).string();
  const std::string labelsPath = (dir / (prefix + "-labels-idx1-ubyte.gz")).string();
  IdxArray images = readIdx(imagesPath, 3, "images N×H×W");
  IdxArray labels = readIdx(labelsPath, 1, "labels N");
  if (labels.dims[0] != images.dims[0]) {
    std::ostringstream os;
    os << labelsPath << ": label count " << labels.dims[0] << " at byte 4 does not match "
       << imagesPath << ", expected " << images.dims[0] << " labels (its image count at byte 4)";
    throw UserError(os.str());
  }
  for (size_t i = 0; i < labels.bytes.size(); ++i) {
    if (labels.bytes[i] >= kClasses) {
      std::ostringstream os;
      os << labelsPath << ": label " << int(labels.bytes[i]) << " at byte " << 8 + i
         << " out of range, expected 0.." << kClasses - 1;
      throw UserError(os.str());
    }
  }
  const int64_t n =
      capped(images.dims[0], split == Split::Train ? data.limit_train : data.limit_test);
  const int64_t h = images.dims[1], w = images.dims[2];
  std::ostringstream how;
  how << "fashion-mnist " << splitName(split) << ": " << n << " samples from " << dir.string()
      << ", ";
  torch::Tensor raw = torch::from_blob(images.bytes.data(), {n, 1, h, w}, torch::kUInt8);
  torch::Tensor x =
      shapeImages(raw, {{0.2860}, {0.3530}}, "fashion-mnist", model, data.normalize, how);
  torch::Tensor y = torch::from_blob(labels.bytes.data(), {n}, torch::kUInt8).to(torch::kLong);
  return std::make_shared<ImageDataset>(x, y, model.channels, model.input_size, kClasses,
                                        how.str());
}

// ---------------------------------------------------------------- CIFAR-10

std::shared_ptr<Dataset> loadCifar10(const DataOptions& data, const model::ModelOptions& model,
                                     Split split) {
  constexpr int64_t kClasses = 10;
  requireImageModel(data, model);
  requireClasses("cifar10", kClasses, model);
  if (data.path.empty()) {
    throw UserError(
        "data.path is empty: cifar10 needs the folder of the binary version ---> HINT: unpack "
        "cifar-10-binary.tar.gz and set data.path to its cifar-10-batches-bin folder "
        "(data_batch_1.bin..data_batch_5.bin, test_batch.bin)");
  }
  const fs::path dir(data.path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw UserError("data.path '" + dir.string() +
                    "' is not a folder (cifar10) ---> HINT: set data.path to the "
                    "cifar-10-batches-bin folder of cifar-10-binary.tar.gz");
  }
  std::vector<std::string> files;
  if (split == Split::Train) {
    for (int i = 1; i <= 5; ++i)
      files.push_back((dir / ("data_batch_" + std::to_string(i) + ".bin")).string());
  } else {
    files.push_back((dir / "test_batch.bin").string());
  }
  CifarRecords records;
  for (const auto& f : files) readCifarBatch(f, kClasses, records);
  const int64_t n =
      capped(records.count(), split == Split::Train ? data.limit_train : data.limit_test);
  std::ostringstream how;
  how << "cifar10 " << splitName(split) << ": " << n << " samples from " << dir.string() << ", ";
  torch::Tensor raw = torch::from_blob(records.pixels.data(), {n, 3, 32, 32}, torch::kUInt8);
  torch::Tensor x = shapeImages(raw, {{0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}},
                                "cifar10", model, data.normalize, how);
  torch::Tensor y = torch::from_blob(records.labels.data(), {n}, torch::kUInt8).to(torch::kLong);
  return std::make_shared<ImageDataset>(x, y, model.channels, model.input_size, kClasses,
                                        how.str());
}

// ---------------------------------------------------------------- synthetic

// Note [Synthetic tasks]
// Synthetic data is a *learnable* task, so that a trainer run on it shows the
// loss going down, and it is a pure function of (seed, split, index):
//  * images: class k has a fixed smooth template (randn at 8×8, bilinearly
//    upsampled to S×S, one per channel); a sample is template + N(0, 1) noise.
//    Train and test share the templates (same task), not the noise.
//  * tokens: a Markov chain over the first A = min(V, 256) token ids. With
//    probability 3/4 the next token is succ(prev) for a fixed random permutation
//    succ, otherwise uniform over the A ids. A model can get from ln V down to the
//    chain's entropy rate, which describe() prints.

/// Stream ids for mixSeed, so that the parts of a task draw unrelated numbers.
enum : uint64_t {
  kStreamTemplates = 1,
  kStreamLabels = 2,
  kStreamNoise = 4,
  kStreamSucc = 5,
  kStreamSeqs = 6
};

uint64_t splitStream(uint64_t stream, Split split) {
  return stream * 2 + (split == Split::Test ? 1 : 0);
}

class SyntheticImages : public Dataset {
 public:
  SyntheticImages(uint64_t seed, Split split, int64_t n, const model::ModelOptions& m)
      : channels_(m.channels), side_(m.input_size), classes_(m.num_classes) {
    const int64_t s = std::min<int64_t>(side_, 8);
    auto gen = at::detail::createCPUGenerator(mixSeed(seed, kStreamTemplates));
    // A torchscript model's samples of another shape than [C, H, H]: templates of it.
    if (!squareImages(m)) shape_ = model::sampleShape(m);
    double_ = m.name == "torchscript" && m.input_dtype == "float64";
    std::vector<int64_t> templateShape = {classes_};
    if (shape_.empty())
      templateShape.insert(templateShape.end(), {channels_, s, s});
    else
      templateShape.insert(templateShape.end(), shape_.begin(), shape_.end());
    templates_ = torch::randn(templateShape, gen, torch::kFloat);
    std::mt19937_64 rng(mixSeed(seed, splitStream(kStreamLabels, split)));
    std::vector<int64_t> labels(n);
    for (auto& l : labels) l = static_cast<int64_t>(uniformBelow(rng, classes_));
    labels_ = torch::tensor(labels, torch::kLong);
    noiseSeed_ = mixSeed(seed, splitStream(kStreamNoise, split));
    std::ostringstream os;
    os << "synthetic " << splitName(split) << ": " << n;
    if (shape_.empty())
      os << " images " << channels_ << "×" << side_ << "×" << side_;
    else
      os << " samples " << torch::IntArrayRef(shape_);
    os << ", " << classes_ << " classes (class template + N(0,1) noise, seed " << seed << ")";
    description_ = os.str();
  }

  int64_t size() const override { return labels_.size(0); }
  int64_t numClasses() const override { return classes_; }
  std::string describe() const override { return description_; }

  Batch get(const std::vector<int64_t>& indices) const override {
    torch::Tensor y = labels_.index_select(0, indexTensor(indices, size()));
    torch::Tensor t = templates_.index_select(0, y);  // (B, C, s, s), or (B, shape)
    if (shape_.empty() && t.size(-1) != side_) t = resizeTo(t, side_);
    std::vector<torch::Tensor> noise;
    noise.reserve(indices.size());
    const std::vector<int64_t> one =
        shape_.empty() ? std::vector<int64_t>{channels_, side_, side_} : shape_;
    for (int64_t i : indices) {
      auto gen = at::detail::createCPUGenerator(mixSeed(noiseSeed_, static_cast<uint64_t>(i)));
      noise.push_back(torch::randn(one, gen, torch::kFloat));
    }
    t.add_(torch::stack(noise));
    if (double_) t = t.to(torch::kDouble);  // a float64 torchscript model's
    return {t, y};
  }

 private:
  int64_t channels_, side_, classes_;
  std::vector<int64_t> shape_;  // a sample's, when not [C, H, H] (torchscript)
  bool double_ = false;
  torch::Tensor templates_;  // (classes, C, s, s), s = min(side, 8), or (classes, shape)
  torch::Tensor labels_;     // (N) long
  uint64_t noiseSeed_ = 0;
  std::string description_;
};

class SyntheticTokens : public Dataset {
 public:
  SyntheticTokens(uint64_t seed, Split split, int64_t n, const model::ModelOptions& m)
      : vocab_(m.num_classes) {
    const int64_t t = m.input_size;
    const int64_t a = std::min<int64_t>(vocab_, 256);
    // succ: a random permutation of [0, a), shared by both splits.
    std::vector<int64_t> succ(a);
    for (int64_t i = 0; i < a; ++i) succ[i] = i;
    std::mt19937_64 prng(mixSeed(seed, kStreamSucc));
    for (int64_t i = a - 1; i > 0; --i) std::swap(succ[i], succ[uniformBelow(prng, i + 1)]);
    std::mt19937_64 rng(mixSeed(seed, splitStream(kStreamSeqs, split)));
    seqs_ = torch::empty({n, t + 1}, torch::kLong);
    int64_t* p = seqs_.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) {
      int64_t tok = static_cast<int64_t>(uniformBelow(rng, a));
      p[r * (t + 1)] = tok;
      for (int64_t j = 1; j <= t; ++j) {
        tok = (rng() >> 62) != 0 ? succ[tok] : static_cast<int64_t>(uniformBelow(rng, a));
        p[r * (t + 1) + j] = tok;
      }
    }
    // Entropy rate of the chain: the successor has p = 3/4 + 1/(4a), the others 1/(4a) each.
    const double q = 0.25 / a, ps = 0.75 + q;
    const double entropy = -ps * std::log(ps) - (a - 1) * q * std::log(q);
    std::ostringstream os;
    os << "synthetic " << splitName(split) << ": " << n << " token sequences of " << t + 1
       << " over vocab " << vocab_ << " (Markov chain on " << a << " ids; best loss " << std::fixed
       << std::setprecision(3) << entropy << " nats vs ln V = " << std::log(double(vocab_))
       << ", seed " << seed << ")";
    description_ = os.str();
  }

  int64_t size() const override { return seqs_.size(0); }
  int64_t numClasses() const override { return vocab_; }
  std::string describe() const override { return description_; }

  Batch get(const std::vector<int64_t>& indices) const override {
    torch::Tensor s = seqs_.index_select(0, indexTensor(indices, size()));  // (B, T+1)
    const int64_t t = s.size(1) - 1;
    return {s.slice(1, 0, t).contiguous(), s.slice(1, 1, t + 1).contiguous()};
  }

 private:
  int64_t vocab_;
  torch::Tensor seqs_;  // (N, T+1) long
  std::string description_;
};

void checkOptions(const DataOptions& data, const model::ModelOptions& model) {
  auto nonNegative = [](const char* key, int64_t v) {
    if (v < 0)
      throw UserError(std::string(key) + " = " + std::to_string(v) + ", expected >= 0 (0 = all)");
  };
  nonNegative("data.limit_train", data.limit_train);
  nonNegative("data.limit_test", data.limit_test);
  if (model.input_size < 1) {
    throw UserError("model.input_size = " + std::to_string(model.input_size) + ", expected >= 1");
  }
  if (!isTokenModel(model) && model.channels < 1) {
    throw UserError("model.channels = " + std::to_string(model.channels) + ", expected >= 1");
  }
  if (model.num_classes < 1 || (isTokenModel(model) && model.num_classes < 2)) {
    throw UserError("model.num_classes = " + std::to_string(model.num_classes) +
                    ", expected >= " + (isTokenModel(model) ? "2 (the vocabulary size)" : "1"));
  }
}

}  // namespace

std::shared_ptr<Dataset> makeDataset(const DataOptions& data, const model::ModelOptions& modelIn,
                                     Split split, uint64_t seed) {
  const model::ModelOptions model = detail::shapedOptions(modelIn);
  const auto& names = dataNames();
  if (std::find(names.begin(), names.end(), data.name) == names.end()) {
    throw UserError("data.name = '" + data.name + "' is not known; allowed: " + joined(names));
  }
  checkOptions(data, model);
  if (data.name == "fashion-mnist") return loadFashionMnist(data, model, split);
  if (data.name == "cifar10") return loadCifar10(data, model, split);
  if (data.name == "tensors") return loadTensors(data, model, split);
  if (data.name == "tokens") return loadTokens(data, model, split);
  PIPEFB_ASSERT(data.name == "synthetic", "unhandled data.name " << data.name);
  const char* key = split == Split::Train ? "data.synthetic_train" : "data.synthetic_test";
  int64_t n = split == Split::Train ? data.synthetic_train : data.synthetic_test;
  if (n < 1) throw UserError(std::string(key) + " = " + std::to_string(n) + ", expected >= 1");
  n = capped(n, split == Split::Train ? data.limit_train : data.limit_test);
  if (isTokenModel(model)) return std::make_shared<SyntheticTokens>(seed, split, n, model);
  return std::make_shared<SyntheticImages>(seed, split, n, model);
}

}  // namespace pipefb::data
