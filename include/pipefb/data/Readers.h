#pragma once
// Readers of the raw file formats behind the data sets: IDX (MNIST, Fashion-MNIST)
// and the CIFAR-10 binary batches. Torch-free: they return bytes, and Dataset.cpp
// turns them into tensors.
//
// Both read through zlib's inflate. A file that starts with the gzip magic
// (1f 8b) is decompressed; any other file is read as it is, so plain `.idx` or
// `.bin` files work too. Every failure is a pipefb::UserError whose one-line
// message names the file and the byte offset *in the uncompressed stream* where
// it went wrong, and says what was expected there (see Note [Reader errors] in
// src/data/Readers.cpp).
#include <cstdint>
#include <string>
#include <vector>

namespace pipefb::data {

/// An IDX array of unsigned bytes: its dimensions and its row-major contents.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // product(dims) bytes
};

/// Reads an IDX file of unsigned bytes (type code 0x08) with `ndims` dimensions,
/// e.g. 3 for images (N, H, W) and 1 for labels (N). `what` names the content for
/// error messages ("images N×H×W"). The stream must end exactly after the data.
IdxArray readIdx(const std::string& path, int ndims, const std::string& what);

/// Reads a whole file (gzip or plain) into memory.
std::vector<uint8_t> readAllBytes(const std::string& path);

/// CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (3×32×32,
/// channel-major: all red, then green, then blue).
struct CifarRecords {
  static constexpr int64_t kPixels = 3 * 32 * 32;
  static constexpr int64_t kRecord = 1 + kPixels;
  std::vector<uint8_t> labels;  // (N)
  std::vector<uint8_t> pixels;  // (N, 3, 32, 32)
  int64_t count() const { return static_cast<int64_t>(labels.size()); }
};

/// Appends the records of one CIFAR-10 batch file to `out`. Labels must be in
/// [0, numClasses).
void readCifarBatch(const std::string& path, int64_t numClasses, CifarRecords& out);

}  // namespace pipefb::data
