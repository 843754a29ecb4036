#include "pipefb/data/Readers.h"

#include <zlib.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "pipefb/common/Error.h"

// Note [Reader errors]
// Every reader error is one line of the form
//   <path>: <what went wrong> at byte <offset>: expected <what was expected>
// where <offset> counts bytes of the *uncompressed* stream, because that is what
// the format describes (the IDX header is bytes 0..15 whether or not the file is
// gzipped). Decompression is done with inflate directly rather than gzread:
// gzread drops the count of the bytes it produced in a call that then fails, so
// it cannot say precisely where a truncated file ends.

namespace pipefb::data {
namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

std::string hex8(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", v);
  return buf;
}

std::string dimsText(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "×" : "") << dims[i];
  return os.str();
}

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw UserError(path + ": " + msg);
}

/// A byte stream over a file that is gzip-compressed (decompressed with inflate)
/// or plain (read as it is). offset() counts uncompressed bytes delivered so far.
class ByteStream {
 public:
  explicit ByteStream(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) fail(path_, std::string("cannot open: ") + std::strerror(errno));
    fill();
    gzip_ = inAvail_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gzip_) {
      std::memset(&z_, 0, sizeof z_);
      // 15 + 16: gzip wrapper only, so a stray zlib stream is not accepted.
      if (inflateInit2(&z_, 15 + 16) != Z_OK) fail(path_, "zlib inflateInit2 failed");
      zInit_ = true;
    }
  }
  ~ByteStream() {
    if (zInit_) inflateEnd(&z_);
    if (file_) std::fclose(file_);
  }
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  const std::string& path() const { return path_; }
  uint64_t offset() const { return offset_; }
  bool gzip() const { return gzip_; }

  /// Reads up to n bytes; fewer only at the end of the stream (then ended() is
  /// true, and truncated() says whether a gzip stream stopped before its trailer).
  /// Throws UserError on corrupt gzip data.
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n && !ended_) {
      if (!gzip_) {
        if (inAvail_ == 0 && !fill()) {
          ended_ = true;
          break;
        }
        size_t k = std::min(n - got, inAvail_);
        std::memcpy(dst + got, in_ + inPos_, k);
        inPos_ += k;
        inAvail_ -= k;
        got += k;
        offset_ += k;
        continue;
      }
      if (inAvail_ == 0) fill();
      z_.next_in = in_ + inPos_;
      z_.avail_in = static_cast<uInt>(inAvail_);
      size_t want = std::min<size_t>(n - got, UINT_MAX);
      z_.next_out = dst + got;
      z_.avail_out = static_cast<uInt>(want);
      int ret = inflate(&z_, Z_NO_FLUSH);
      size_t produced = want - z_.avail_out;
      size_t consumed = inAvail_ - z_.avail_in;
      inPos_ += consumed;
      inAvail_ -= consumed;
      got += produced;
      offset_ += produced;
      if (ret == Z_STREAM_END) {
        // Another gzip member may follow (as gzread allows); anything else is
        // ignored as trailing garbage, again as gzread does.
        if (inAvail_ == 0) fill();
        if (inAvail_ >= 2 && in_[inPos_] == 0x1f && in_[inPos_ + 1] == 0x8b) {
          inflateReset(&z_);
        } else {
          ended_ = true;
        }
      } else if (ret == Z_BUF_ERROR || (ret == Z_OK && produced == 0 && consumed == 0)) {
        if (inAvail_ == 0 && eof_) {
          ended_ = true;
          truncated_ = true;
        }
      } else if (ret != Z_OK) {
        std::ostringstream os;
        os << "corrupt gzip data at byte " << offset_ << " of the uncompressed stream (zlib: "
           << (z_.msg ? z_.msg : "error " + std::to_string(ret))
           << "), expected an intact gzip stream: the file is damaged";
        fail(path_, os.str());
      }
    }
    return got;
  }

  bool ended() const { return ended_; }
  bool truncated() const { return truncated_; }

 private:
  /// Moves the unread input to the front and reads more. False at end of file.
  bool fill() {
    if (eof_) return inAvail_ > 0;
    if (inPos_ > 0 && inAvail_ > 0) std::memmove(in_, in_ + inPos_, inAvail_);
    inPos_ = 0;
    size_t k = std::fread(in_ + inAvail_, 1, buffer_.size() - inAvail_, file_);
    if (k == 0) {
      if (std::ferror(file_)) fail(path_, std::string("read error: ") + std::strerror(errno));
      eof_ = true;
    }
    inAvail_ += k;
    return inAvail_ > 0;
  }

  std::string path_;
  std::FILE* file_ = nullptr;
  bool gzip_ = false;
  bool zInit_ = false;
  z_stream z_{};
  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(1 << 18);  // heap: callers may be threads
  uint8_t* in_ = buffer_.data();
  size_t inPos_ = 0, inAvail_ = 0;
  bool eof_ = false, ended_ = false, truncated_ = false;
  uint64_t offset_ = 0;
};

std::string notGzipNote(const ByteStream& s) {
  return s.gzip() ? "" : " (the file is not gzip-compressed; read as plain bytes)";
}

/// Reads exactly n bytes or fails with a "truncated" message that says how long
/// the whole stream should have been (`total`, described by `layout`).
void readExact(ByteStream& s, uint8_t* dst, size_t n, uint64_t total, const std::string& layout) {
  size_t got = s.read(dst, n);
  if (got < n) {
    std::ostringstream os;
    os << "truncated at byte " << s.offset() << ": expected " << total << " bytes (" << layout
       << ")" << (s.truncated() ? ", the gzip stream ends early" : "") << notGzipNote(s);
    fail(s.path(), os.str());
  }
}

/// After the data: the stream must end here (and a gzip stream must be complete).
void expectEnd(ByteStream& s, uint64_t total, const std::string& layout) {
  uint8_t extra;
  if (s.read(&extra, 1) == 1) {
    std::ostringstream os;
    os << "unexpected data after byte " << total << ": expected the data to end there (" << layout
       << ")";
    fail(s.path(), os.str());
  }
  if (s.truncated()) {
    std::ostringstream os;
    os << "truncated at byte " << s.offset() << ": the gzip stream ends before its trailer"
       << " (the data, " << total << " bytes, is complete but unchecked)";
    fail(s.path(), os.str());
  }
}

}  // namespace

IdxArray readIdx(const std::string& path, int ndims, const std::string& what) {
  PIPEFB_ASSERT(ndims >= 1 && ndims <= 4, "readIdx: ndims " << ndims);
  ByteStream s(path);
  const uint32_t expectedMagic = 0x00000800u | static_cast<uint32_t>(ndims);
  const std::string headerLayout = std::to_string(4 + 4 * ndims) + "-byte IDX header with " +
                                   std::to_string(ndims) + " dimension" + (ndims > 1 ? "s" : "");

  uint8_t head[4 + 4 * 4];
  readExact(s, head, 4, 4 + 4 * ndims, headerLayout);
  const uint32_t magic = (uint32_t(head[0]) << 24) | (uint32_t(head[1]) << 16) |
                         (uint32_t(head[2]) << 8) | uint32_t(head[3]);
  if (magic != expectedMagic) {
    std::ostringstream os;
    os << "bad magic " << hex32(magic) << " at byte 0, expected " << hex32(expectedMagic) << " (IDX"
       << ndims << " unsigned byte " << what << ")";
    if (head[0] == 0 && head[1] == 0 && head[2] == 0x08 && head[3] != ndims)
      os << "; the file has " << int(head[3]) << " dimension" << (head[3] == 1 ? "" : "s");
    else if (head[0] == 0 && head[1] == 0 && head[3] == ndims)
      os << "; type code " << hex8(head[2]) << " at byte 2 is not 0x08 (unsigned byte)";
    os << notGzipNote(s);
    fail(path, os.str());
  }
  readExact(s, head + 4, 4 * ndims, 4 + 4 * ndims, headerLayout);

  IdxArray out;
  uint64_t count = 1;
  // Cap on the data size: a garbled header must not make us allocate terabytes.
  constexpr uint64_t kMaxBytes = uint64_t(1) << 34;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* p = head + 4 + 4 * d;
    uint32_t v = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
    if (v == 0 || v > 0x7fffffffu) {
      std::ostringstream os;
      os << "dimension " << d << " is " << v << " at byte " << 4 + 4 * d
         << ", expected a positive size (" << what << ")";
      fail(path, os.str());
    }
    out.dims.push_back(v);
    count *= v;
    if (count > kMaxBytes) {
      std::ostringstream os;
      os << "dimensions at bytes 4.." << 4 + 4 * ndims - 1 << " claim more than " << kMaxBytes
         << " bytes of " << what << ", expected a sane size (garbled header?)";
      fail(path, os.str());
    }
  }
  const uint64_t header = 4 + 4 * ndims;
  const uint64_t total = header + count;
  const std::string layout =
      std::to_string(header) + "-byte header + " + dimsText(out.dims) + " " + what;
  out.bytes.resize(count);
  readExact(s, out.bytes.data(), count, total, layout);
  expectEnd(s, total, layout);
  return out;
}

std::vector<uint8_t> readAllBytes(const std::string& path) {
  ByteStream s(path);
  std::vector<uint8_t> out;
  size_t chunk = 1 << 20;
  for (;;) {
    size_t at = out.size();
    out.resize(at + chunk);
    size_t got = s.read(out.data() + at, chunk);
    out.resize(at + got);
    if (got < chunk) break;
    if (chunk < (size_t(1) << 26)) chunk *= 2;
  }
  if (s.truncated()) {
    std::ostringstream os;
    os << "truncated at byte " << s.offset() << ": the gzip stream ends before its trailer";
    fail(path, os.str());
  }
  return out;
}

void readCifarBatch(const std::string& path, int64_t numClasses, CifarRecords& out) {
  const std::vector<uint8_t> bytes = readAllBytes(path);
  const int64_t size = static_cast<int64_t>(bytes.size());
  const int64_t rec = CifarRecords::kRecord;
  if (size == 0) {
    fail(path, "empty at byte 0: expected records of " + std::to_string(rec) +
                   " bytes (1 label + 3072 pixels)");
  }
  if (size % rec != 0) {
    const int64_t n = size / rec;
    std::ostringstream os;
    os << "truncated at byte " << size << ": record " << n << " is incomplete, expected "
       << (n + 1) * rec << " bytes (records of " << rec << " bytes: 1 label + 3072 pixels)";
    fail(path, os.str());
  }
  const int64_t n = size / rec;
  const size_t labels0 = out.labels.size(), pixels0 = out.pixels.size();
  out.labels.resize(labels0 + n);
  out.pixels.resize(pixels0 + n * CifarRecords::kPixels);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* r = bytes.data() + i * rec;
    if (r[0] >= numClasses) {
      std::ostringstream os;
      os << "label " << int(r[0]) << " at byte " << i * rec << " (record " << i
         << ") out of range, expected 0.." << numClasses - 1;
      fail(path, os.str());
    }
    out.labels[labels0 + i] = r[0];
    std::memcpy(out.pixels.data() + pixels0 + i * CifarRecords::kPixels, r + 1,
                CifarRecords::kPixels);
  }
}

}  // namespace pipefb::data
