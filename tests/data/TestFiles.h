#pragma once
// Helpers for the data tests: a private temp folder, and writers of IDX and
// CIFAR-10 files (gzip through zlib's gzopen/gzwrite, or plain).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pipefb/common/Error.h"

namespace pipefb::data::testing {

/// A fresh folder under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("pipefb-data-") + (info ? info->name() : "x") + "-" +
                       std::to_string(::getpid());
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void writeGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

inline void writeRaw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<uint8_t> readRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void putBe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

/// An IDX stream: magic 0x0000 08 <ndims>, big-endian dims, then the data.
inline std::vector<uint8_t> idxBytes(const std::vector<uint32_t>& dims,
                                     const std::vector<uint8_t>& data, uint32_t magic = 0) {
  std::vector<uint8_t> out;
  putBe32(out, magic ? magic : 0x800u | static_cast<uint32_t>(dims.size()));
  for (uint32_t d : dims) putBe32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

/// Deterministic pseudo-random bytes (a small LCG; no dependence on torch).
inline std::vector<uint8_t> patternBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

/// Expects `fn` to throw pipefb::UserError and returns its message ("" if not).
template <class Fn>
std::string userErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    // PIPEFB_PRINT_ERRORS=1 shows the messages, to review their wording.
    if (std::getenv("PIPEFB_PRINT_ERRORS")) std::printf("  UserError: %s\n", e.what());
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected UserError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected UserError, nothing was thrown";
  return "";
}

}  // namespace pipefb::data::testing
