#pragma once
// Byte sizes as people write them: "512MiB", "2GiB", "1.5GB", "4096", "unlimited".
#include <cstdint>
#include <optional>
#include <string>

namespace pipefb {

/// Parses a byte size. Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB)
/// suffixes, case-insensitive, optional fractional part. Returns nullopt when the
/// text is not a size. "unlimited" is not handled here (see Config).
std::optional<int64_t> parseSize(const std::string& text);

/// Formats bytes for people: "1.50 GiB", "512.0 MiB", "17 B".
std::string formatBytes(int64_t bytes);

}  // namespace pipefb
