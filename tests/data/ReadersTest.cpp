// IDX and CIFAR-10 files that the tests write themselves: good files round-trip
// exactly; every kind of broken file gives a UserError that names the file and
// the byte offset.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "TestFiles.h"
#include "pipefb/common/Error.h"
#include "pipefb/data/Dataset.h"
#include "pipefb/data/Readers.h"

namespace pipefb::data {
namespace {
using testing::idxBytes;
using testing::patternBytes;
using testing::readRaw;
using testing::TempDir;
using testing::userErrorOf;
using testing::writeGz;
using testing::writeRaw;

constexpr uint32_t kN = 7, kH = 28, kW = 28;

model::ModelOptions imageModel(int64_t side, int64_t channels) {
  model::ModelOptions m;
  m.name = "mlp";
  m.input_size = side;
  m.channels = channels;
  m.num_classes = 10;
  return m;
}

std::vector<uint8_t> someLabels(size_t n) {
  std::vector<uint8_t> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = static_cast<uint8_t>((i * 7 + 3) % 10);
  return l;
}

/// A Fashion-MNIST-like train split in `dir`; returns the pixels it wrote.
std::vector<uint8_t> writeFashionTrain(const TempDir& dir, uint32_t n = kN) {
  auto pixels = patternBytes(size_t(n) * kH * kW, 1);
  writeGz(dir.file("train-images-idx3-ubyte.gz"), idxBytes({n, kH, kW}, pixels));
  writeGz(dir.file("train-labels-idx1-ubyte.gz"), idxBytes({n}, someLabels(n)));
  return pixels;
}

DataOptions fashionAt(const TempDir& dir) {
  DataOptions d;
  d.name = "fashion-mnist";
  d.path = dir.str();
  d.normalize = false;
  return d;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// ------------------------------------------------------------------ IDX

TEST(IdxReader, GoodFileRoundTripsExactly) {
  TempDir dir;
  auto pixels = writeFashionTrain(dir);
  IdxArray a = readIdx(dir.file("train-images-idx3-ubyte.gz"), 3, "images N×H×W");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{kN, kH, kW}));
  EXPECT_EQ(a.bytes, pixels);

  // Through the data set: unnormalised 28 px 1-channel images are pixel / 255.
  auto ds = makeDataset(fashionAt(dir), imageModel(28, 1), Split::Train, 0);
  ASSERT_EQ(ds->size(), kN);
  EXPECT_EQ(ds->numClasses(), 10);
  Batch b = ds->get(iota(kN));
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{kN, 1, kH, kW}));
  auto back = b.input.mul(255).round().to(torch::kUInt8).contiguous();
  EXPECT_TRUE(torch::equal(
      back.flatten(), torch::from_blob(pixels.data(), {int64_t(pixels.size())}, torch::kUInt8)));
  auto labels = someLabels(kN);
  for (uint32_t i = 0; i < kN; ++i) EXPECT_EQ(b.target[i].item<int64_t>(), labels[i]);
}

TEST(IdxReader, PlainUncompressedFileIsReadToo) {
  TempDir dir;
  auto pixels = patternBytes(3 * 4 * 5, 2);
  writeRaw(dir.file("a.idx"), idxBytes({3, 4, 5}, pixels));
  IdxArray a = readIdx(dir.file("a.idx"), 3, "images N×H×W");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(a.bytes, pixels);
}

TEST(IdxReader, PaddingCentresAndNormalises) {
  TempDir dir;
  auto pixels = writeFashionTrain(dir);
  DataOptions d = fashionAt(dir);
  d.normalize = true;
  auto ds = makeDataset(d, imageModel(32, 3), Split::Train, 0);
  Batch b = ds->get({0, 1});
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{2, 3, 32, 32}));
  const float border = (0.0f - 0.2860f) / 0.3530f;
  EXPECT_NEAR(b.input[0][0][0][0].item<float>(), border, 1e-5);
  EXPECT_NEAR(b.input[1][2][31][31].item<float>(), border, 1e-5);
  // Pixel (y, x) of the file lands at (y + 2, x + 2), identical in all 3 channels.
  const int y = 5, x = 9;
  const float want = (pixels[kH * kW + y * kW + x] / 255.0f - 0.2860f) / 0.3530f;
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(b.input[1][c][y + 2][x + 2].item<float>(), want, 1e-5);
}

TEST(IdxReader, TruncatedStreamNamesFileAndOffset) {
  TempDir dir;
  auto full = idxBytes({kN, kH, kW}, patternBytes(kN * kH * kW, 3));
  std::vector<uint8_t> cut(full.begin(), full.begin() + 1000);
  const std::string path = dir.file("cut.gz");
  writeGz(path, cut);
  std::string msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated at byte 1000: expected " + std::to_string(full.size()) + " bytes"),
            std::string::npos)
      << msg;

  // A .gz file cut in the middle of its compressed bytes.
  const std::string path2 = dir.file("cut2.gz");
  writeGz(path2, full);
  auto gz = readRaw(path2);
  writeRaw(path2, std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  msg = userErrorOf([&] { readIdx(path2, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path2 + ": truncated at byte "), std::string::npos) << msg;
  EXPECT_NE(msg.find("the gzip stream ends early"), std::string::npos) << msg;

  // Only the header's first bytes.
  writeGz(path, {0, 0, 8});
  msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path + ": truncated at byte 3: expected 16 bytes"), std::string::npos) << msg;
}

TEST(IdxReader, BadMagic) {
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  writeGz(path, idxBytes({kN, kH, kW}, patternBytes(kN * kH * kW, 4), /*magic=*/0x12345678));
  std::string msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_EQ(msg, path +
                     ": bad magic 0x12345678 at byte 0, expected 0x00000803 (IDX3 unsigned "
                     "byte images N×H×W)");
  // Wrong element type (0x0D = float).
  writeGz(path, idxBytes({kN, kH, kW}, patternBytes(kN * kH * kW, 4), 0x00000D03));
  msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find("type code 0x0D at byte 2"), std::string::npos) << msg;
}

TEST(IdxReader, WrongDimensionCount) {
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  // A label file (1 dimension) where images (3) are expected.
  writeGz(path, idxBytes({kN}, someLabels(kN)));
  std::string msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path + ": bad magic 0x00000801 at byte 0, expected 0x00000803"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the file has 1 dimension"), std::string::npos) << msg;
}

TEST(IdxReader, ZeroOrHugeDimension) {
  TempDir dir;
  const std::string path = dir.file("z.gz");
  writeGz(path, idxBytes({kN, 0, kW}, {}));
  std::string msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path + ": dimension 1 is 0 at byte 8"), std::string::npos) << msg;
  writeGz(path, idxBytes({0x7fffffff, 0x7fffffff, 28}, {}));
  msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path + ": dimensions at bytes 4..15 claim more than"), std::string::npos)
      << msg;
}

TEST(IdxReader, TrailingDataIsAnError) {
  TempDir dir;
  const std::string path = dir.file("long.gz");
  auto bytes = idxBytes({kN}, someLabels(kN));
  bytes.push_back(0);
  writeGz(path, bytes);
  std::string msg = userErrorOf([&] { readIdx(path, 1, "labels N"); });
  EXPECT_NE(msg.find(path + ": unexpected data after byte 15"), std::string::npos) << msg;
}

TEST(IdxReader, LabelImageCountMismatch) {
  TempDir dir;
  writeFashionTrain(dir);
  const std::string labels = dir.file("train-labels-idx1-ubyte.gz");
  writeGz(labels, idxBytes({kN - 1}, someLabels(kN - 1)));
  std::string msg =
      userErrorOf([&] { makeDataset(fashionAt(dir), imageModel(32, 1), Split::Train, 0); });
  EXPECT_EQ(msg, labels + ": label count 6 at byte 4 does not match " +
                     dir.file("train-images-idx3-ubyte.gz") +
                     ", expected 7 labels (its image count at byte 4)");
}

TEST(IdxReader, LabelOutOfRange) {
  TempDir dir;
  writeFashionTrain(dir);
  auto labels = someLabels(kN);
  labels[4] = 10;
  const std::string path = dir.file("train-labels-idx1-ubyte.gz");
  writeGz(path, idxBytes({kN}, labels));
  std::string msg =
      userErrorOf([&] { makeDataset(fashionAt(dir), imageModel(32, 1), Split::Train, 0); });
  EXPECT_EQ(msg, path + ": label 10 at byte 12 out of range, expected 0..9");
}

TEST(IdxReader, MissingFile) {
  TempDir dir;
  writeFashionTrain(dir);
  // The test split was never written.
  std::string msg =
      userErrorOf([&] { makeDataset(fashionAt(dir), imageModel(32, 1), Split::Test, 0); });
  EXPECT_EQ(msg,
            dir.file("t10k-images-idx3-ubyte.gz") + ": cannot open: No such file or directory");
}

TEST(IdxReader, GarbageNotGzip) {
  TempDir dir;
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  writeRaw(path, patternBytes(5000, 9));
  std::string msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_NE(msg.find(path + ": bad magic 0x"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at byte 0, expected 0x00000803"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not gzip-compressed"), std::string::npos) << msg;
}

TEST(IdxReader, CorruptGzipBody) {
  TempDir dir;
  const std::string path = dir.file("bad.gz");
  // Compressible content, so the deflate stream has Huffman-coded blocks to break.
  std::vector<uint8_t> data(kN * kH * kW);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i / 50) % 7);
  writeGz(path, idxBytes({kN, kH, kW}, data));
  auto gz = readRaw(path);
  for (size_t i = 20; i < gz.size() - 8; i += 3) gz[i] ^= 0xA5;
  writeRaw(path, gz);
  std::string msg = userErrorOf([&] { readIdx(path, 3, "images N×H×W"); });
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(" at byte "), std::string::npos) << msg;
}

TEST(IdxReader, CorruptGzipChecksum) {
  TempDir dir;
  const std::string path = dir.file("crc.gz");
  auto bytes = idxBytes({kN}, someLabels(kN));
  writeGz(path, bytes);
  auto gz = readRaw(path);
  gz[gz.size() - 6] ^= 0xFF;  // inside the CRC-32 of the gzip trailer
  writeRaw(path, gz);
  std::string msg = userErrorOf([&] { readIdx(path, 1, "labels N"); });
  EXPECT_EQ(msg, path + ": corrupt gzip data at byte " + std::to_string(bytes.size()) +
                     " of the uncompressed stream (zlib: incorrect data check), expected an intact "
                     "gzip stream: the file is damaged");
}

// ------------------------------------------------------------------ data set errors

TEST(MakeDataset, MissingFolderNamesTheDebianPackage) {
  DataOptions d;
  d.name = "fashion-mnist";
  d.path = "/nonexistent/pipefb-fashion";
  std::string msg = userErrorOf([&] { makeDataset(d, imageModel(32, 1), Split::Train, 0); });
  EXPECT_NE(msg.find("/nonexistent/pipefb-fashion"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(MakeDataset, UnknownNameListsTheAllowedOnes) {
  DataOptions d;
  d.name = "mnist";
  std::string msg = userErrorOf([&] { makeDataset(d, imageModel(32, 1), Split::Train, 0); });
  EXPECT_EQ(
      msg,
      "data.name = 'mnist' is not known; allowed: fashion-mnist, cifar10, synthetic, tensors, "
      "tokens");
}

TEST(MakeDataset, ImageDataForATokenModelIsRefused) {
  TempDir dir;
  writeFashionTrain(dir);
  model::ModelOptions m;
  m.name = "gpt2";
  m.input_size = 16;
  m.num_classes = 100;
  std::string msg = userErrorOf([&] { makeDataset(fashionAt(dir), m, Split::Train, 0); });
  EXPECT_NE(msg.find("data.name=synthetic"), std::string::npos) << msg;
}

TEST(MakeDataset, TooFewModelClasses) {
  TempDir dir;
  writeFashionTrain(dir);
  auto m = imageModel(32, 1);
  m.num_classes = 5;
  std::string msg = userErrorOf([&] { makeDataset(fashionAt(dir), m, Split::Train, 0); });
  EXPECT_NE(msg.find("model.num_classes = 5"), std::string::npos) << msg;
}

// ------------------------------------------------------------------ CIFAR-10

/// Writes CIFAR-10 batch files: `perFile` records in each of data_batch_1..5.bin
/// and in test_batch.bin. Returns all training records in order.
std::vector<uint8_t> writeCifar(const TempDir& dir, int perFile) {
  std::vector<uint8_t> train;
  for (int f = 1; f <= 6; ++f) {
    std::vector<uint8_t> bytes;
    for (int r = 0; r < perFile; ++r) {
      bytes.push_back(static_cast<uint8_t>((f * 3 + r) % 10));
      auto px = patternBytes(3072, f * 100 + r);
      bytes.insert(bytes.end(), px.begin(), px.end());
    }
    std::string name = f <= 5 ? "data_batch_" + std::to_string(f) + ".bin" : "test_batch.bin";
    writeRaw(dir.file(name), bytes);
    if (f <= 5) train.insert(train.end(), bytes.begin(), bytes.end());
  }
  return train;
}

DataOptions cifarAt(const TempDir& dir) {
  DataOptions d;
  d.name = "cifar10";
  d.path = dir.str();
  d.normalize = false;
  return d;
}

TEST(Cifar10, PixelsAndLabelsRoundTrip) {
  TempDir dir;
  auto train = writeCifar(dir, 3);
  auto ds = makeDataset(cifarAt(dir), imageModel(32, 3), Split::Train, 0);
  ASSERT_EQ(ds->size(), 15);
  Batch b = ds->get(iota(15));
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{15, 3, 32, 32}));
  auto back = b.input.mul(255).round().to(torch::kUInt8).contiguous();
  const uint8_t* p = back.data_ptr<uint8_t>();
  for (int r = 0; r < 15; ++r) {
    const uint8_t* rec = train.data() + r * 3073;
    EXPECT_EQ(b.target[r].item<int64_t>(), rec[0]) << "record " << r;
    EXPECT_EQ(std::memcmp(p + r * 3072, rec + 1, 3072), 0) << "record " << r;
  }
  EXPECT_EQ(makeDataset(cifarAt(dir), imageModel(32, 3), Split::Test, 0)->size(), 3);

  // Limit, and the test split.
  DataOptions d = cifarAt(dir);
  d.limit_train = 4;
  EXPECT_EQ(makeDataset(d, imageModel(32, 3), Split::Train, 0)->size(), 4);
}

TEST(Cifar10, GreyResizeAndNormalise) {
  TempDir dir;
  auto train = writeCifar(dir, 2);
  // 1 channel: the mean of R, G, B.
  auto grey = makeDataset(cifarAt(dir), imageModel(32, 1), Split::Train, 0)->get({0});
  ASSERT_EQ(grey.input.sizes(), (std::vector<int64_t>{1, 1, 32, 32}));
  const uint8_t* rec = train.data() + 1;
  float want = (rec[0] + rec[1024] + rec[2048]) / 3.0f / 255.0f;
  EXPECT_NEAR(grey.input[0][0][0][0].item<float>(), want, 1e-5);
  // 24 px: bilinear resize (shrinking is never padding).
  auto small = makeDataset(cifarAt(dir), imageModel(24, 3), Split::Train, 0)->get({0, 1, 2});
  ASSERT_EQ(small.input.sizes(), (std::vector<int64_t>{3, 3, 24, 24}));
  // Normalised with the CIFAR-10 channel statistics.
  DataOptions d = cifarAt(dir);
  d.normalize = true;
  auto norm = makeDataset(d, imageModel(32, 3), Split::Train, 0)->get({0});
  EXPECT_NEAR(norm.input[0][2][0][0].item<float>(), (rec[2048] / 255.0f - 0.4465f) / 0.2616f, 1e-5);
}

TEST(Cifar10, TruncatedRecordNamesFileAndOffset) {
  TempDir dir;
  writeCifar(dir, 2);
  const std::string path = dir.file("test_batch.bin");
  auto bytes = readRaw(path);
  bytes.resize(3073 + 100);
  writeRaw(path, bytes);
  std::string msg =
      userErrorOf([&] { makeDataset(cifarAt(dir), imageModel(32, 3), Split::Test, 0); });
  EXPECT_EQ(msg, path +
                     ": truncated at byte 3173: record 1 is incomplete, expected 6146 bytes "
                     "(records of 3073 bytes: 1 label + 3072 pixels)");
}

TEST(Cifar10, BadLabelAndMissingBatch) {
  TempDir dir;
  writeCifar(dir, 2);
  const std::string path = dir.file("data_batch_3.bin");
  auto bytes = readRaw(path);
  bytes[3073] = 200;
  writeRaw(path, bytes);
  std::string msg =
      userErrorOf([&] { makeDataset(cifarAt(dir), imageModel(32, 3), Split::Train, 0); });
  EXPECT_EQ(msg, path + ": label 200 at byte 3073 (record 1) out of range, expected 0..9");

  writeCifar(dir, 2);
  std::filesystem::remove(dir.file("data_batch_5.bin"));
  // The test split does not need the training files.
  EXPECT_NO_THROW(makeDataset(cifarAt(dir), imageModel(32, 3), Split::Test, 0));
  msg = userErrorOf([&] { makeDataset(cifarAt(dir), imageModel(32, 3), Split::Train, 0); });
  EXPECT_EQ(msg, dir.file("data_batch_5.bin") + ": cannot open: No such file or directory");
}

}  // namespace
}  // namespace pipefb::data
