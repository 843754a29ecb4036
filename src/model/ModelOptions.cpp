// Torch-free checks and derived sizes of ModelOptions (library pipefb_model_options).
#include "pipefb/model/ModelOptions.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "pipefb/common/Error.h"

namespace pipefb::model {
namespace {

std::string joined(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : ", ") + x;
  return out;
}

[[noreturn]] void fail(const std::string& key, const std::string& msg) {
  throw UserError(key + ": " + msg);
}

bool contains(const std::vector<std::string>& xs, const std::string& x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

}  // namespace

int64_t minInputSize(const std::string& modelName) {
  // vgg16: 32 -> 16 -> 8 -> 4 -> 2 -> 1 through five 2x2/2 max-pools; 31 would reach 0.
  if (modelName == "vgg16") return 32;
  // alexnet: conv 11x11/4 pad 2 gives floor((H-7)/4)+1, then three 3x3/2 max-pools
  // need 15 -> 7 -> 3 -> 1, so H - 7 >= 56.
  if (modelName == "alexnet") return 63;
  return 1;
}

int64_t scaled(int64_t base, double width) {
  return std::max<int64_t>(1,
                           static_cast<int64_t>(std::llround(static_cast<double>(base) * width)));
}

bool isTokenModel(const ModelOptions& o) {
  return o.name == "gpt2" || (o.name == "torchscript" && o.input_dtype == "int64");
}

std::vector<int64_t> sampleShape(const ModelOptions& o) {
  if (o.name == "torchscript") return o.sample_shape;
  if (o.name == "gpt2") return {o.input_size};
  return {o.channels, o.input_size, o.input_size};
}

namespace {
// CRC-32 of a file's bytes (zlib), or 0 when it cannot be read (validate says why).
uint32_t fileCrc(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return 0;  // /dev/zero would never end
  // Read once per (path, size, modification time): the runtime loads the model again for
  // each stage's weight copies, and a ResNet50 file is 100 MB.
  const auto size = std::filesystem::file_size(path, ec);
  const auto when = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  static std::mutex mu;
  static std::map<std::tuple<std::string, std::uintmax_t, long long>, uint32_t> known;
  const auto key = std::make_tuple(path, size, static_cast<long long>(when));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  std::ifstream in(path, std::ios::binary);
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
  }
  std::lock_guard<std::mutex> lock(mu);
  return known[key] = static_cast<uint32_t>(crc);
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}
}  // namespace

std::string modelKey(const ModelOptions& o) {
  std::ostringstream s;
  s << o.name;
  if (o.name == "torchscript") {
    const std::string file = o.path.substr(o.path.find_last_of('/') + 1);
    s << "-" << file << " crc32=" << std::hex << std::setw(8) << std::setfill('0')
      << fileCrc(o.path) << std::dec << " sample=" << shapeText(o.sample_shape)
      << " dtype=" << o.input_dtype << " classes=" << o.num_classes;
    return s.str();
  }
  if (o.name == "gpt2") s << "-" << o.size;
  if (o.loss_chunk > 0) s << " loss_chunk=" << o.loss_chunk;  // Note [Chunked loss]
  s << " width=" << o.width << " input=" << o.input_size;
  if (o.name != "gpt2") s << " channels=" << o.channels;
  s << " classes=" << o.num_classes;
  if (o.batch_norm) s << " batch_norm";
  if (o.name == "mlp") {
    s << " hidden=";
    for (size_t i = 0; i < o.hidden.size(); ++i) s << (i ? "," : "") << o.hidden[i];
  }
  return s.str();
}

void validate(const ModelOptions& o) {
  if (!contains(modelNames(), o.name)) {
    fail("model.name", "unknown model '" + o.name + "'; allowed: " + joined(modelNames()));
  }
  if (o.loss_chunk < 0)
    fail("model.loss_chunk", "got " + std::to_string(o.loss_chunk) +
                                 "; allowed: 0 (off) or the tokens per chunk, >= 1");
  if (o.loss_chunk > 0 && o.name != "gpt2")
    fail("model.loss_chunk", "applies to gpt2 only (a loss over a vocabulary), not " + o.name +
                                 "; allowed here: 0 (or remove the key)");
  if (o.name == "torchscript") {
    // Cheap checks only: the file's content is checked where it is loaded (TorchScript.cpp).
    if (o.path.empty())
      fail("model.path",
           "model.name torchscript loads a file torch.jit.save wrote; set model.path");
    if (!std::ifstream(o.path, std::ios::binary))
      fail("model.path", "'" + o.path + "' cannot be read (does it exist?)");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.path, ec))
      fail("model.path", "'" + o.path + "' is not a file; give the file torch.jit.save wrote");
    if (o.sample_shape.empty())
      fail("model.sample_shape",
           "model.name torchscript needs one sample's shape without the batch dimension, e.g. "
           "[3, 32, 32] or [128]");
    for (int64_t d : o.sample_shape)
      if (d < 1)
        fail("model.sample_shape",
             "got " + shapeText(o.sample_shape) + "; every size must be >= 1");
    if (o.input_dtype != "float32" && o.input_dtype != "float64" && o.input_dtype != "int64")
      fail("model.input_dtype", "got '" + o.input_dtype + "'; allowed: float32, float64, int64");
    if (o.input_dtype == "int64" && o.sample_shape.size() != 1)
      fail("model.sample_shape", "got " + shapeText(o.sample_shape) +
                                     " for model.input_dtype int64; a token model takes [T], the "
                                     "sequence length");
    if (o.num_classes < 2)
      fail("model.num_classes", "got " + std::to_string(o.num_classes) +
                                    "; the model's classes (or vocabulary) must be >= 2");
    return;
  }
  if (!std::isfinite(o.width) || o.width <= 0.0) {
    std::ostringstream os;
    os << "got " << o.width
       << "; must be a finite number > 0 (1.0 gives the reference shapes, 0.125 a small model)";
    fail("model.width", os.str());
  }
  if (!std::isfinite(o.dropout) || o.dropout < 0.0 || o.dropout >= 1.0) {
    std::ostringstream os;
    os << "got " << o.dropout << "; must be in [0, 1)";
    fail("model.dropout", os.str());
  }
  if (o.num_classes < 1) {
    fail("model.num_classes", "got " + std::to_string(o.num_classes) +
                                  (o.name == "gpt2" ? " (the gpt2 vocabulary size)" : "") +
                                  "; must be >= 1");
  }
  if (o.batch_norm && o.name != "vgg16")
    fail("model.batch_norm", "only vgg16 has a batch-norm variant (vgg16_bn); got true for " +
                                 o.name + "; allowed: false");
  const int64_t minSize = minInputSize(o.name);
  if (o.input_size < minSize) {
    std::string why = o.name == "gpt2" ? " (the gpt2 sequence length)" : "";
    if (o.name == "alexnet") {
      why =
          " (alexnet's stride-4 first conv and three 3x3/2 max-pools need it; set "
          "model.input_size=64 and let the data be padded/resized)";
    } else if (o.name == "vgg16") {
      why =
          " (vgg16's five 2x2 max-pools need it; set model.input_size=32 and let the data be "
          "padded/resized)";
    }
    fail("model.input_size", "got " + std::to_string(o.input_size) + " for " + o.name +
                                 "; must be >= " + std::to_string(minSize) + why);
  }
  if (o.name != "gpt2" && o.channels < 1) {
    fail("model.channels", "got " + std::to_string(o.channels) + "; must be >= 1");
  }
  if (o.name == "gpt2" && !contains(gpt2Sizes(), o.size)) {
    fail("model.size", "unknown gpt2 size '" + o.size + "'; allowed: " + joined(gpt2Sizes()));
  }
  if (o.name == "mlp") {
    for (size_t i = 0; i < o.hidden.size(); ++i) {
      if (o.hidden[i] < 1) {
        fail("model.hidden", "entry " + std::to_string(i) + " is " + std::to_string(o.hidden[i]) +
                                 "; every hidden size must be >= 1");
      }
    }
  }
}

// Note [GPT-2 sizes]
// tiny is ours (2 layers, 128 dim, 4 heads) for tests; the others are OpenAI's.
// The width multiplier scales the embedding dim and rounds it to a multiple of the
// head count (at least one dim per head); layers and heads stay as they are.
Gpt2Config gpt2Config(const ModelOptions& o) {
  struct Row {
    const char* size;
    int64_t layers, dim, heads;
  };
  static const Row rows[] = {{"tiny", 2, 128, 4},
                             {"small", 12, 768, 12},
                             {"medium", 24, 1024, 16},
                             {"large", 36, 1280, 20},
                             {"xl", 48, 1600, 25}};
  for (const auto& r : rows) {
    if (o.size != r.size) continue;
    Gpt2Config c;
    c.n_layer = r.layers;
    c.n_head = r.heads;
    const double perHead = static_cast<double>(r.dim) * o.width / static_cast<double>(r.heads);
    c.n_embd = r.heads * std::max<int64_t>(1, static_cast<int64_t>(std::llround(perHead)));
    c.n_ctx = o.input_size;
    c.vocab = o.num_classes;
    return c;
  }
  fail("model.size", "unknown gpt2 size '" + o.size + "'; allowed: " + joined(gpt2Sizes()));
}

}  // namespace pipefb::model
