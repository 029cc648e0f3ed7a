// modar sweep enumerates one shape table per architecture for all budgets
// whose windows overlap, and picks each budget's curve from it.  Reference:
// the same sweep one budget at a time (each budget enumerates its own table,
// the straightforward path); every row must be identical, bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "modar/planner.hpp"

namespace {

std::vector<std::string> csv_rows(const modar::SweepRequest& request) {
  std::vector<std::string> rows;
  modar::sweep(request,
               [&](const modar::SweepRow& row) { rows.push_back(modar::to_csv_line(row)); });
  return rows;
}

void expect_same_as_one_budget_at_a_time(const modar::SweepRequest& request) {
  const std::vector<std::string> together = csv_rows(request);
  std::vector<std::string> separately;
  for (const double budget : request.flops) {
    modar::SweepRequest one = request;
    one.flops = {budget};
    const std::vector<std::string> rows = csv_rows(one);
    separately.insert(separately.end(), rows.begin(), rows.end());
  }
  ASSERT_EQ(together.size(), separately.size());
  ASSERT_FALSE(together.empty());
  for (size_t i = 0; i < together.size(); ++i) {
    EXPECT_EQ(together[i], separately[i]) << "row " << i;
  }
}

TEST(SweepSharedTable, OverlappingBudgetsGiveTheRowsOfOneBudgetAtATime) {
  modar::SweepRequest request;
  request.flops = {6e18, 1e19, 2e19, 5e19, 1e20};  // overlapping windows: shared table
  request.arch = {"baseline", "mod", "dar", "mod+dar"};
  request.capacity = {0.125, 0.5};
  request.every = {1, 2};
  request.block_layers = {1, 4};
  request.streams = {2, 3};
  request.with_time = true;
  expect_same_as_one_budget_at_a_time(request);
}

TEST(SweepSharedTable, DistantBudgetsGiveTheRowsOfOneBudgetAtATime) {
  modar::SweepRequest request;
  request.flops = {1e18, 1e23};  // disjoint windows: per-budget tables
  request.arch = {"baseline", "mod+dar"};
  request.with_time = false;
  expect_same_as_one_budget_at_a_time(request);
  request.flops = {1e18, 3e18, 1e23};  // mixed: one table spanning all
  request.grid_half_width = 40.0;
  expect_same_as_one_budget_at_a_time(request);
}

}  // namespace
