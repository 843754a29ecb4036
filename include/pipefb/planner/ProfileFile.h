#pragma once
// Profile files (YAML): the measured profile's cache, also usable for analytic profiles.
// The key names model, shapes and device; pipefb_profile reuses a file whose key matches.
#include <string>

#include "pipefb/planner/LayerCost.h"

namespace pipefb::planner {

/// The cache key: "<model key> | microbatch=<n> | device=<name>".
std::string profileKey(const Profile& p);

std::string profileToYaml(const Profile& p);
Profile parseProfile(const std::string& yaml, const std::string& source);
void writeProfileFile(const std::string& path, const Profile& p);
Profile readProfileFile(const std::string& path);

}  // namespace pipefb::planner
