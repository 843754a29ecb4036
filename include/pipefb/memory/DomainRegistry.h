#pragma once
// The process-wide set of memory domains, by name: "cpu:0", "cpu:1", ... for
// virtual devices, "host" for the host pool, "unscoped" for allocations made
// outside any MemoryScope. Domains are never destroyed (see MemoryDomain.h);
// reconfigure one with configureDomain() or MemoryDomain::setCapacity().
#include <cstdint>
#include <string>
#include <vector>

#include "pipefb/memory/MemoryDomain.h"

namespace pipefb::memory {

/// Name of the host pool's domain.
inline constexpr const char* kHostDomain = "host";
/// Name of the domain that takes allocations made with no scope.
inline constexpr const char* kUnscopedDomain = "unscoped";

/// "cpu:3" for index 3.
std::string virtualDeviceName(int index);

/// The domain called `name`; created with unlimited capacity if new.
MemoryDomain& getOrCreateDomain(const std::string& name);
/// The domain called `name` with its capacity set to `capacity` (created if new).
MemoryDomain& configureDomain(const std::string& name, int64_t capacity);
/// nullptr if there is no such domain.
MemoryDomain* findDomain(const std::string& name);
/// By MemoryDomain::id(); PIPEFB_ASSERTs that it exists.
MemoryDomain& domainById(int id);
/// All domains, in creation order.
std::vector<MemoryDomain*> allDomains();

MemoryDomain& hostDomain();
MemoryDomain& unscopedDomain();

}  // namespace pipefb::memory
