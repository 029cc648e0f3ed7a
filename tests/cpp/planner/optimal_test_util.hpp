// Shared by the planner tests of `optimal`: a recommendation by architecture and role.
#pragma once

#include <stdexcept>
#include <string>

#include "modar/planner.hpp"

namespace {

const modar::Recommendation& find(const modar::OptimalResult& result, const std::string& arch,
                                  const std::string& role) {
  for (const modar::Recommendation& rec : result.recommendations) {
    if (rec.arch == arch && rec.role == role) {
      return rec;
    }
  }
  throw std::runtime_error("no recommendation " + arch + " / " + role);
}

}  // namespace
