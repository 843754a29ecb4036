#include "pipefb/memory/DomainRegistry.h"

#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "pipefb/common/Error.h"

namespace pipefb::memory {
namespace {

std::string defaultHint(const std::string& name) {
  if (name == kHostDomain)
    return "HINT: raise the host pool's capacity (host.memory), or offload fewer stages "
           "(pipeline.stash: checkpoint-offload moves only stage inputs to the host).";
  if (name == kUnscopedDomain)
    return "HINT: this allocation had no MemoryScope; give the allocating thread one.";
  return "HINT: raise devices.memory, use pipeline.stash: checkpoint or offload, or more "
         "microbatches.";
}

// Never destroyed: blocks freed during static destruction still reach their domain.
struct Registry {
  std::mutex mu;
  std::deque<std::unique_ptr<MemoryDomain>> domains;  // by id; stable addresses
  std::unordered_map<std::string, MemoryDomain*> byName;

  MemoryDomain& getOrCreate(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = byName.find(name);
    if (it != byName.end()) return *it->second;
    const int id = static_cast<int>(domains.size());
    domains.push_back(std::make_unique<MemoryDomain>(id, name, kUnlimited, defaultHint(name)));
    byName.emplace(name, domains.back().get());
    return *domains.back();
  }
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

std::string virtualDeviceName(int index) { return "cpu:" + std::to_string(index); }

MemoryDomain& getOrCreateDomain(const std::string& name) { return registry().getOrCreate(name); }

MemoryDomain& configureDomain(const std::string& name, int64_t capacity) {
  MemoryDomain& d = registry().getOrCreate(name);
  d.setCapacity(capacity);
  return d;
}

MemoryDomain* findDomain(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.byName.find(name);
  return it == r.byName.end() ? nullptr : it->second;
}

MemoryDomain& domainById(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  PIPEFB_ASSERT(id >= 0 && static_cast<std::size_t>(id) < r.domains.size(),
                "no memory domain with id " << id);
  return *r.domains[static_cast<std::size_t>(id)];
}

std::vector<MemoryDomain*> allDomains() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<MemoryDomain*> out;
  for (auto& d : r.domains) out.push_back(d.get());
  return out;
}

MemoryDomain& hostDomain() {
  static MemoryDomain& d = getOrCreateDomain(kHostDomain);
  return d;
}

MemoryDomain& unscopedDomain() {
  static MemoryDomain& d = getOrCreateDomain(kUnscopedDomain);
  return d;
}

}  // namespace pipefb::memory
