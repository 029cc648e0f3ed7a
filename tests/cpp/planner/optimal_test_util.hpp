// Shared by the planner tests of `optimal`: a recommendation by architecture and role,
// and a run at a FLOP budget.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

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

// optimal() at a training-FLOP budget for the named architectures, every
// other request field at its default.
inline modar::OptimalResult optimal_at(double flops, const std::vector<std::string>& arch) {
  modar::OptimalRequest request;
  request.flops = flops;
  request.arch = arch;
  return modar::optimal(request);
}

}  // namespace
