// tests/cpp/runtime/test_op_harness.cpp: ONE harness for every op of the op
// table (op_args.hpp) on every backend (ggml's test-backend-ops pattern, with
// FlashAttention's error rule).
//
// Each table row has one case (forward and backward ops are rows of their
// own): the tensors it needs and the op calls it makes (a backward case first
// runs its forward, so the saved state is consistent).  A case runs
//   * on the CPU in fp64: the reference;
//   * on the CPU in fp32 and bf16: its error against the reference must be
//     within the dtype's tolerance (relative to the output's scale);
//   * on every other registered backend (CUDA when a GPU is present; skipped
//     otherwise) in fp32 and bf16: FlashAttention's rule, its error against
//     the fp64 reference is at most 2x the CPU's error at the same dtype plus a
//     small floor (the two differ in summation order only).
// Inputs are the same values in every run (rounded to bf16-representable
// numbers).  Index outputs (top-k) must be equal.  Every case must produce a
// non-zero reference (a case that computes nothing could not fail).
//
// Performance mode: MODAR_OP_HARNESS_PERF=N rebuilds every case at base size N
// and prints the time of each op per backend and dtype (a table; no assertion).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"

namespace modar::runtime {
namespace {

// ---- what a case is made of ----------------------------------------------------

enum class Role {
  data,        // float data dtype, uniform [-1, 1]
  positive,    // data dtype, uniform [0.5, 1.5]
  stats,       // stats_type(data), uniform [-1, 1]
  stats_pos,   // stats_type(data), uniform [0.5, 1.5]
  stats_unit,  // stats_type(data), uniform [0, 1] (BCE targets)
  master,      // fp64 when data is fp64, else fp32; uniform [-1, 1]
  master_pos,  // as master, uniform [0.01, 0.02] (AdamW second moment)
  zeros,       // data dtype, zeros (outputs)
  stats_zeros,
  master_zeros,
  lowp_zeros,  // data dtype when it differs from master, else an empty tensor
  fp32_zeros,
  index,   // i32 in [0, limit)
  sorted,  // i32 [b, k]: ascending distinct positions 2j or 2j + 1 (k <= limit / 2)
  given,   // i32 with the given values
};

struct Spec {
  std::vector<int64_t> shape;
  Role role = Role::data;
  int64_t limit = 0;
  std::vector<double> values;
};

Spec T(std::vector<int64_t> shape, Role role = Role::data, int64_t limit = 0) {
  return Spec{std::move(shape), role, limit, {}};
}
Spec Given(std::vector<int64_t> shape, std::vector<double> values) {
  return Spec{std::move(shape), Role::given, 0, std::move(values)};
}

using Views = std::vector<TensorView>;
struct Case {
  std::vector<Spec> tensors;
  std::function<std::vector<OpArgs>(const Views&)> calls;  // the last one is the op under test
  std::vector<int> outputs;                                // compared tensors
};
using CaseBuilder = std::function<Case(int64_t n)>;

constexpr Role D = Role::data, P = Role::positive, S = Role::stats, SP = Role::stats_pos,
               Z = Role::zeros, SZ = Role::stats_zeros;

// One case per row of the op table, at base size n (tokens / rows).
const std::map<std::string, CaseBuilder>& cases() {
  static const std::map<std::string, CaseBuilder> all = {
      {"copy",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{CopyArgs{v[0], v[1]}};
                     },
                     {1}};
       }},
      {"fill",
       [](int64_t n) {
         return Case{{T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{FillArgs{v[0], 0.75}};
                     },
                     {0}};
       }},
      {"convert",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}, Role::fp32_zeros)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{ConvertArgs{v[0], v[1]}};
                     },
                     {1}};
       }},
      {"gemm",
       [](int64_t n) {
         return Case{{T({n, 12}), T({12, 5}), T({n, 5}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{GemmArgs{v[0], false, v[1], false, v[2]}};
                     },
                     {2}};
       }},
      {"rmsnorm_forward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({8}, P), T({n, 8}, Z), T({n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{RmsnormForwardArgs{v[0], v[1], v[2], v[3]}};
                     },
                     {2, 3}};
       }},
      {"rmsnorm_backward",
       [](int64_t n) {
         return Case{
             {T({n, 8}), T({8}, P), T({n, 8}, Z), T({n}, SZ), T({n, 8}), T({n, 8}, Z), T({8}, Z)},
             [](const Views& v) {
               return std::vector<OpArgs>{RmsnormForwardArgs{v[0], v[1], v[2], v[3]},
                                          RmsnormBackwardArgs{v[4], v[0], v[1], v[3], v[5], v[6]}};
             },
             {5, 6}};
       }},
      {"rope_forward",
       [](int64_t n) {
         return Case{{T({2, n, 3, 8}), T({2, n}, Role::index, 64), T({2, n, 3, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{RopeForwardArgs{v[0], v[1], v[2], {}}};
                     },
                     {2}};
       }},
      {"rope_backward",
       [](int64_t n) {
         return Case{{T({2, n, 3, 8}), T({2, n}, Role::index, 64), T({2, n, 3, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{RopeBackwardArgs{v[0], v[1], v[2], {}}};
                     },
                     {2}};
       }},
      {"attention_forward",
       [](int64_t n) {
         return Case{{T({2, n, 2, 8}), T({2, n, 1, 8}), T({2, n, 1, 8}), T({2, n, 2, 8}, Z),
                      T({2, 2, n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           AttentionForwardArgs{v[0], v[1], v[2], {}, v[3], v[4], {}}};
                     },
                     {3, 4}};
       }},
      {"attention_backward",
       [](int64_t n) {
         return Case{{T({2, n, 2, 8}), T({2, n, 1, 8}), T({2, n, 1, 8}), T({2, n, 2, 8}, Z),
                      T({2, 2, n}, SZ), T({2, n, 2, 8}), T({2, n, 2, 8}, Z), T({2, n, 1, 8}, Z),
                      T({2, n, 1, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           AttentionForwardArgs{v[0], v[1], v[2], {}, v[3], v[4], {}},
                           AttentionBackwardArgs{
                               v[5], v[0], v[1], v[2], {}, v[3], v[4], v[6], v[7], v[8], {}}};
                     },
                     {6, 7, 8}};
       }},
      {"router_forward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({8}), T({n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{RouterForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"router_backward",
       [](int64_t n) {
         return Case{{T({n}, S), T({n, 8}), T({8}), T({n, 8}, Z), T({8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{RouterBackwardArgs{v[0], v[1], v[2], v[3], v[4]}};
                     },
                     {3, 4}};
       }},
      {"topk",
       [](int64_t n) {
         return Case{{T({2, 2 * n}, S), T({2, n}, Role::index, 1)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{TopkArgs{v[0], v[1]}};
                     },
                     {1}};
       }},
      {"topk_ragged",
       [](int64_t n) {
         return Case{{T({2, 2 * n}, S), Given({2}, {static_cast<double>(n), 1.0}),
                      T({2, n}, Role::index, 1)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{TopkRaggedArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"topk_mask",
       [](int64_t n) {
         return Case{{Given({2, 2}, {0.0, 2.0, 1.0, -1.0}), T({2, n + 3}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{TopkMaskArgs{v[0], v[1]}};
                     },
                     {1}};
       }},
      {"gather_rows_forward",
       [](int64_t n) {
         return Case{{T({2, 2 * n, 8}), T({2, n}, Role::sorted, 2 * n), T({2, n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{GatherRowsForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"gather_rows_backward",
       [](int64_t n) {
         return Case{{T({2, n, 8}), T({2, n}, Role::sorted, 2 * n), T({2, 2 * n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{GatherRowsBackwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"scatter_add_scaled_forward",
       [](int64_t n) {
         return Case{
             {T({2, 2 * n, 8}), T({2, n}, Role::sorted, 2 * n), T({2, 2 * n}, S), T({2, n, 8})},
             [](const Views& v) {
               return std::vector<OpArgs>{
                   ScatterAddScaledForwardArgs{v[0], v[1], v[2], v[3], RouterScale::sigmoid}};
             },
             {0}};
       }},
      {"scatter_add_scaled_backward",
       [](int64_t n) {
         return Case{{T({2, 2 * n, 8}), T({2, n}, Role::sorted, 2 * n), T({2, 2 * n}, S),
                      T({2, n, 8}), T({2, n, 8}, Z), T({2, 2 * n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{ScatterAddScaledBackwardArgs{
                           v[0], v[1], v[2], v[3], RouterScale::linear, v[4], v[5]}};
                     },
                     {4, 5}};
       }},
      {"depth_read_prefix_forward",
       [](int64_t n) {
         return Case{{T({3, n, 8}), T({3, n}, SP), T({3, n, 8}), T({2, 8}, S), T({2, n, 8}, Z),
                      T({2, n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           DepthReadPrefixForwardArgs{v[0], v[1], v[2], v[3], v[4], v[5]}};
                     },
                     {4, 5}};
       }},
      {"depth_read_prefix_backward",
       [](int64_t n) {
         return Case{{T({3, n, 8}), T({3, n}, SP), T({3, n, 8}), T({2, 8}, S), T({2, n, 8}, Z),
                      T({2, n}, SZ), T({2, n, 8}), T({2, n}, S), T({3, n, 8}, Z), T({3, n, 8}, Z),
                      T({2, 8}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           DepthReadPrefixForwardArgs{v[0], v[1], v[2], v[3], v[4], v[5]},
                           DepthReadPrefixBackwardArgs{v[6], v[7], v[0], v[1], v[2], v[3], v[4],
                                                       v[5], v[8], v[9], v[10]}};
                     },
                     {8, 9, 10}};
       }},
      {"depth_read_merge_forward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n}, S), T({n, 8}), T({n}, SP), T({n, 8}), T({8}, S),
                      T({n, 8}, Z), T({n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{DepthReadMergeForwardArgs{
                           v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}};
                     },
                     {6, 7}};
       }},
      {"depth_read_merge_backward",
       [](int64_t n) {
         return Case{
             {T({n, 8}), T({n}, S), T({n, 8}), T({n}, SP), T({n, 8}), T({8}, S), T({n, 8}, Z),
              T({n}, SZ), T({n, 8}), T({n, 8}, Z), T({n}, SZ), T({n, 8}, Z), T({n, 8}, Z),
              T({8}, SZ)},
             [](const Views& v) {
               return std::vector<OpArgs>{
                   DepthReadMergeForwardArgs{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]},
                   DepthReadMergeBackwardArgs{v[8], v[0], v[2], v[3], v[4], v[5], v[7], v[9], v[10],
                                              v[11], v[12], v[13]}};
             },
             {9, 10, 11, 12, 13}};
       }},
      // DAR head with n = 2 streams and transport: outputs = 2n + 1 = 5.
      {"dar_coefficients_forward",
       [](int64_t n) {
         return Case{{T({2, n, 8}), T({16, 5}, S), T({5}, S), T({3}, SP), T({n, 2}, SZ),
                      T({n, 2}, SZ), T({n, 2, 2}, SZ), T({n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{DarCoefficientsForwardArgs{
                           v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], {}}};
                     },
                     {4, 5, 6, 7}};
       }},
      {"dar_coefficients_backward",
       [](int64_t n) {
         return Case{
             {T({2, n, 8}), T({16, 5}, S), T({5}, S), T({3}, SP), T({n, 2}, SZ), T({n, 2}, SZ),
              T({n, 2, 2}, SZ), T({n}, SZ), T({n, 2}, S), T({n, 2}, S), T({n, 2, 2}, S),
              T({2, n, 8}, Z), T({16, 5}, SZ), T({5}, SZ), T({3}, SZ)},
             [](const Views& v) {
               return std::vector<OpArgs>{
                   DarCoefficientsForwardArgs{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], {}},
                   DarCoefficientsBackwardArgs{v[8],
                                               v[9],
                                               v[10],
                                               v[0],
                                               v[1],
                                               v[2],
                                               v[3],
                                               v[4],
                                               v[5],
                                               v[6],
                                               v[7],
                                               v[11],
                                               v[12],
                                               v[13],
                                               v[14],
                                               {}}};
             },
             {11, 12, 13, 14}};
       }},
      {"dar_mix_forward",
       [](int64_t n) {
         return Case{{T({2, n, 8}), T({n, 2}, S), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{DarMixForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"dar_mix_backward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({2, n, 8}), T({n, 2}, S), T({2, n, 8}, Z), T({n, 2}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{DarMixBackwardArgs{v[0], v[1], v[2], v[3], v[4]}};
                     },
                     {3, 4}};
       }},
      {"dar_write_forward",
       [](int64_t n) {
         return Case{
             {T({n, 2, 2}, S), T({2, n, 8}), T({n, 2}, S), T({n, 8}), T({2, n, 8}, Z)},
             [](const Views& v) {
               return std::vector<OpArgs>{DarWriteForwardArgs{v[0], v[1], v[2], v[3], v[4]}};
             },
             {4}};
       }},
      {"dar_write_backward",
       [](int64_t n) {
         return Case{{T({2, n, 8}), T({n, 2, 2}, S), T({2, n, 8}), T({n, 2}, S), T({n, 8}),
                      T({n, 2, 2}, SZ), T({2, n, 8}, Z), T({n, 2}, SZ), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{DarWriteBackwardArgs{v[0], v[1], v[2], v[3], v[4],
                                                                       v[5], v[6], v[7], v[8]}};
                     },
                     {5, 6, 7, 8}};
       }},
      {"gelu_forward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{GeluForwardArgs{v[0], v[1]}};
                     },
                     {1}};
       }},
      {"gelu_backward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{GeluBackwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"swiglu_forward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{SwigluForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"swiglu_backward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}), T({n, 8}), T({n, 8}, Z), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{SwigluBackwardArgs{v[0], v[1], v[2], v[3], v[4]}};
                     },
                     {3, 4}};
       }},
      {"add",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{AddArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"axpy",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8})},
                     [](const Views& v) {
                       return std::vector<OpArgs>{AxpyArgs{0.5, v[0], v[1]}};
                     },
                     {1}};
       }},
      {"scale",
       [](int64_t n) {
         return Case{{T({n, 8})},
                     [](const Views& v) {
                       return std::vector<OpArgs>{ScaleArgs{v[0], -1.5}};
                     },
                     {0}};
       }},
      {"mul_forward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MulForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"mul_backward",
       [](int64_t n) {
         return Case{{T({n, 8}), T({n, 8}), T({n, 8}), T({n, 8}, Z), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MulBackwardArgs{v[0], v[1], v[2], v[3], v[4]}};
                     },
                     {3, 4}};
       }},
      {"cross_entropy_forward",
       [](int64_t n) {
         return Case{{T({n, 16}), T({n}, Role::index, 16), T({1}, SZ), T({n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{CrossEntropyForwardArgs{v[0], v[1], v[2], v[3]}};
                     },
                     {2, 3}};
       }},
      {"cross_entropy_backward",
       [](int64_t n) {
         return Case{{T({n, 16}), T({n}, Role::index, 16), T({1}, SZ), T({n}, SZ), T({n, 16}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           CrossEntropyForwardArgs{v[0], v[1], v[2], v[3]},
                           CrossEntropyBackwardArgs{2.0, v[0], v[1], v[3], v[4]}};
                     },
                     {4}};
       }},
      {"bce_with_logits_forward",
       [](int64_t n) {
         return Case{{T({2 * n}, S), T({2 * n}, Role::stats_unit), T({1}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{BceWithLogitsForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"bce_with_logits_backward",
       [](int64_t n) {
         return Case{{T({2 * n}, S), T({2 * n}, Role::stats_unit), T({2 * n}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{BceWithLogitsBackwardArgs{1.0, v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"embedding_forward",
       [](int64_t n) {
         return Case{{T({32, 8}), T({2, n}, Role::index, 32), T({2, n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{EmbeddingForwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"embedding_backward",
       [](int64_t n) {
         return Case{{T({2, n, 8}), T({2, n}, Role::index, 32), T({32, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{EmbeddingBackwardArgs{v[0], v[1], v[2]}};
                     },
                     {2}};
       }},
      {"adamw_update",
       [](int64_t n) {
         return Case{
             {T({n * 8}, Role::master), T({n * 8}), T({n * 8}, Role::master),
              T({n * 8}, Role::master_pos), T({n * 8}, Role::lowp_zeros)},
             [](const Views& v) {
               AdamWParams hyper;
               hyper.learning_rate = 0.01;
               hyper.weight_decay = 0.1;
               hyper.step = 3;
               return std::vector<OpArgs>{AdamwUpdateArgs{v[0], v[1], v[2], v[3], hyper, v[4]}};
             },
             {0, 2, 3}};
       }},
      // Mixture of Experts: T = n tokens, 8 experts (the last 2 null in the
      // dispatch cases: counts has 6 entries), top-2.
      {"moe_route_forward",
       [](int64_t n) {
         return Case{{T({n, 8}, S), T({n, 8}, SZ), T({n, 2}, Role::index, 1), T({n, 2}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           MoeRouteForwardArgs{v[0], v[1], v[2], v[3], MoeRouteParams{true}}};
                     },
                     {1, 2, 3}};
       }},
      {"moe_route_backward",
       [](int64_t n) {
         return Case{{T({n, 8}, S), T({n, 8}, SZ), T({n, 2}, Role::index, 1), T({n, 2}, SZ),
                      T({n, 2}, S), T({n, 8}, SZ)},
                     [](const Views& v) {
                       const MoeRouteParams params{true};
                       return std::vector<OpArgs>{
                           MoeRouteForwardArgs{v[0], v[1], v[2], v[3], params},
                           MoeRouteBackwardArgs{v[4], v[1], v[2], v[3], v[5], params}};
                     },
                     {5}};
       }},
      {"moe_aux_loss_forward",
       [](int64_t n) {
         return Case{{T({n, 8}, S), T({n, 8}, SZ), T({n, 2}, Role::index, 1), T({n, 2}, SZ),
                      T({2}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MoeRouteForwardArgs{v[0], v[1], v[2], v[3]},
                                                  MoeAuxLossForwardArgs{v[0], v[1], v[2], v[4]}};
                     },
                     {4}};
       }},
      {"moe_aux_loss_backward",
       [](int64_t n) {
         return Case{{T({n, 8}, S), T({n, 8}, SZ), T({n, 2}, Role::index, 1), T({n, 2}, SZ),
                      T({n, 8}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           MoeRouteForwardArgs{v[0], v[1], v[2], v[3]},
                           MoeAuxLossBackwardArgs{1.5, 0.5, v[0], v[1], v[2], v[4]}};
                     },
                     {4}};
       }},
      {"moe_dispatch",
       [](int64_t n) {
         return Case{{T({n, 2}, Role::index, 8), T({6}, Role::index, 1), T({n, 2}, Role::index, 1)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MoeDispatchArgs{v[0], v[1], v[2], 2}};
                     },
                     {1, 2}};
       }},
      {"moe_permute_forward",
       [](int64_t n) {
         return Case{{T({n, 2}, Role::index, 8), T({6}, Role::index, 1), T({n, 2}, Role::index, 1),
                      T({n, 8}), T({2 * n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MoeDispatchArgs{v[0], v[1], v[2], 0},
                                                  MoePermuteForwardArgs{v[3], v[2], v[4]}};
                     },
                     {4}};
       }},
      {"moe_permute_backward",
       [](int64_t n) {
         return Case{{T({n, 2}, Role::index, 8), T({6}, Role::index, 1), T({n, 2}, Role::index, 1),
                      T({2 * n, 8}), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MoeDispatchArgs{v[0], v[1], v[2], 0},
                                                  MoePermuteBackwardArgs{v[3], v[2], v[4]}};
                     },
                     {4}};
       }},
      {"moe_unpermute_forward",
       [](int64_t n) {
         return Case{{T({n, 2}, Role::index, 8), T({6}, Role::index, 1), T({n, 2}, Role::index, 1),
                      T({2 * n, 8}), T({n, 2}, S), T({n, 8}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{MoeDispatchArgs{v[0], v[1], v[2], 0},
                                                  MoeUnpermuteForwardArgs{v[3], v[2], v[4], v[5]}};
                     },
                     {5}};
       }},
      {"moe_unpermute_backward",
       [](int64_t n) {
         return Case{{T({n, 2}, Role::index, 8), T({6}, Role::index, 1), T({n, 2}, Role::index, 1),
                      T({n, 8}), T({2 * n, 8}), T({n, 2}, S), T({2 * n, 8}, Z), T({n, 2}, SZ)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           MoeDispatchArgs{v[0], v[1], v[2], 0},
                           MoeUnpermuteBackwardArgs{v[3], v[4], v[2], v[5], v[6], v[7]}};
                     },
                     {6, 7}};
       }},
      {"grouped_gemm",
       [](int64_t n) {
         const double first = static_cast<double>(n / 3);
         return Case{{T({n, 12}), T({3, 12, 5}), Given({3}, {first, 0.0, double(n) - first}),
                      T({n, 5}, Z)},
                     [](const Views& v) {
                       return std::vector<OpArgs>{
                           GroupedGemmArgs{v[0], false, v[1], false, v[3], v[2]}};
                     },
                     {3}};
       }},
  };
  return all;
}

// ---- running a case -------------------------------------------------------------

double bf16_round(double value) {
  return bf16_to_float(float_to_bf16(static_cast<float>(value)));
}

ScalarType dtype_of(Role role, ScalarType data) {
  const ScalarType master = data == ScalarType::fp64 ? ScalarType::fp64 : ScalarType::fp32;
  switch (role) {
    case Role::data:
    case Role::positive:
    case Role::zeros:
    case Role::lowp_zeros:
      return data;
    case Role::stats:
    case Role::stats_pos:
    case Role::stats_unit:
    case Role::stats_zeros:
      return stats_type(data);
    case Role::master:
    case Role::master_pos:
    case Role::master_zeros:
      return master;
    case Role::fp32_zeros:
      return ScalarType::fp32;
    case Role::index:
    case Role::sorted:
    case Role::given:
      return ScalarType::i32;
  }
  return data;
}

// The same values for every dtype (seeded by the tensor's position).
std::vector<double> values_for(const Spec& spec, size_t position) {
  int64_t count = 1;
  for (int64_t d : spec.shape)
    count *= d;
  std::mt19937 generator(static_cast<uint32_t>(1000 + 17 * position));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> values(static_cast<size_t>(count), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    const double u = unit(generator);
    double& v = values[static_cast<size_t>(i)];
    switch (spec.role) {
      case Role::data:
      case Role::stats:
      case Role::master:
        v = bf16_round(2.0 * u - 1.0);
        break;
      case Role::positive:
      case Role::stats_pos:
        v = bf16_round(0.5 + u);
        break;
      case Role::stats_unit:
        v = bf16_round(u);
        break;
      case Role::master_pos:
        v = bf16_round(0.01 + 0.01 * u);
        break;
      case Role::index:
        v = std::floor(u * static_cast<double>(spec.limit));
        break;
      case Role::sorted: {
        const int64_t width = spec.shape.back();
        v = static_cast<double>(2 * (i % width) + (u < 0.5 ? 0 : 1));
        break;
      }
      case Role::given:
        v = spec.values[static_cast<size_t>(i)];
        break;
      default:
        break;  // zeros
    }
  }
  return values;
}

struct RunResult {
  std::vector<std::vector<double>> outputs;
  std::vector<bool> is_index;
  double seconds_per_call = 0.0;
};

RunResult run_case(Backend& backend, const Case& c, ScalarType data, int timed_calls = 0) {
  std::vector<Tensor> tensors;
  Views views;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const Spec& spec = c.tensors[i];
    if (spec.role == Role::lowp_zeros &&
        dtype_of(Role::master, data) == dtype_of(Role::lowp_zeros, data)) {
      tensors.emplace_back();
      views.emplace_back();
      continue;
    }
    tensors.push_back(
        make_tensor(backend, spec.shape, dtype_of(spec.role, data), values_for(spec, i)));
    views.push_back(tensors.back().view());
  }
  const std::vector<OpArgs> calls = c.calls(views);
  for (const OpArgs& call : calls)
    backend.run(call);
  RunResult result;
  for (int index : c.outputs) {
    result.outputs.push_back(download(backend, views[static_cast<size_t>(index)]));
    result.is_index.push_back(views[static_cast<size_t>(index)].dtype == ScalarType::i32);
  }
  if (timed_calls > 0) {
    backend.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < timed_calls; ++i)
      backend.run(calls.back());
    backend.synchronize();
    result.seconds_per_call =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        timed_calls;
  }
  return result;
}

// max |a - b| / max(1, max |b|).
double scaled_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

double cpu_tolerance(ScalarType dtype) {
  return dtype == ScalarType::bf16 ? 3e-2 : 1e-4;
}
double floor_tolerance(ScalarType dtype) {
  return dtype == ScalarType::bf16 ? 8e-3 : 1e-4;
}

Backend& cpu_backend() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return *backend;
}

constexpr int64_t kTestSize = 6;

// ---- the tests --------------------------------------------------------------------

// Every row of the op table has a harness case, and every case names a row.
TEST(OpHarness, EveryTableRowHasACase) {
  for (const OpInfo& info : kOpTable) {
    EXPECT_EQ(cases().count(info.name), 1u) << "no harness case for op " << info.name;
  }
  for (const auto& [name, builder] : cases()) {
    OpId id{};
    EXPECT_TRUE(parse_op_id(name.c_str(), &id)) << "harness case " << name << " is no table row";
  }
}

class OpHarnessCase : public ::testing::TestWithParam<std::string> {};

// The case's last call is the op it is named after (so the table row is what runs).
TEST_P(OpHarnessCase, RunsItsOp) {
  const Case c = cases().at(GetParam())(kTestSize);
  std::vector<Tensor> unused;
  Views views(c.tensors.size());
  const std::vector<OpArgs> calls = c.calls(views);
  ASSERT_FALSE(calls.empty());
  EXPECT_STREQ(op_info(op_id(calls.back())).name, GetParam().c_str());
}

TEST_P(OpHarnessCase, CpuLowPrecisionAgreesWithFp64) {
  const Case c = cases().at(GetParam())(kTestSize);
  const RunResult reference = run_case(cpu_backend(), c, ScalarType::fp64);
  for (size_t o = 0; o < reference.outputs.size(); ++o) {
    EXPECT_GT(
        scaled_error(reference.outputs[o], std::vector<double>(reference.outputs[o].size(), 0.0)),
        0.0)
        << GetParam() << ": output " << o << " of the fp64 reference is all zeros";
  }
  for (ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
    const RunResult low = run_case(cpu_backend(), c, dtype);
    for (size_t o = 0; o < reference.outputs.size(); ++o) {
      if (reference.is_index[o]) {
        EXPECT_EQ(low.outputs[o], reference.outputs[o]) << GetParam() << " " << to_string(dtype);
        continue;
      }
      const double error = scaled_error(low.outputs[o], reference.outputs[o]);
      EXPECT_LE(error, cpu_tolerance(dtype))
          << GetParam() << ": cpu " << to_string(dtype) << " output " << o;
    }
  }
}

// FlashAttention's rule on every other registered backend.
TEST_P(OpHarnessCase, OtherBackendsWithinTwiceTheCpuError) {
  const Case c = cases().at(GetParam())(kTestSize);
  const RunResult reference = run_case(cpu_backend(), c, ScalarType::fp64);
  int ran = 0;
  for (const std::string& name : available_backends()) {
    if (name == "cpu")
      continue;
    std::unique_ptr<Backend> backend;
    try {
      backend = make_backend(name);
    } catch (const BackendError&) {
      continue;  // e.g. CUDA built but no GPU on this machine
    }
    for (ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
      if (!backend->supports(op_id(c.calls(Views(c.tensors.size())).back()), dtype))
        continue;
      const RunResult cpu_low = run_case(cpu_backend(), c, dtype);
      const RunResult other = run_case(*backend, c, dtype);
      ++ran;
      for (size_t o = 0; o < reference.outputs.size(); ++o) {
        if (reference.is_index[o]) {
          EXPECT_EQ(other.outputs[o], reference.outputs[o]) << GetParam() << " on " << name;
          continue;
        }
        const double cpu_error = scaled_error(cpu_low.outputs[o], reference.outputs[o]);
        const double error = scaled_error(other.outputs[o], reference.outputs[o]);
        EXPECT_LE(error, 2.0 * cpu_error + floor_tolerance(dtype))
            << GetParam() << " on " << name << " " << to_string(dtype) << " output " << o
            << " (cpu error " << cpu_error << ")";
      }
    }
  }
  if (ran == 0)
    GTEST_SKIP() << "no backend other than the CPU can run here (no GPU)";
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const OpInfo& info : kOpTable)
    names.emplace_back(info.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpHarnessCase, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// MODAR_OP_HARNESS_PERF=N: every case at base size N, timed per backend and dtype.
TEST(OpHarness, PerformanceMode) {
  const char* size_text = std::getenv("MODAR_OP_HARNESS_PERF");
  if (size_text == nullptr)
    GTEST_SKIP() << "set MODAR_OP_HARNESS_PERF=N to time every op at base size N";
  const int64_t size = std::max<int64_t>(1, std::atoll(size_text));
  std::printf("%-30s %-8s %-6s %12s\n", "op", "backend", "dtype", "us/call");
  for (const std::string& name : available_backends()) {
    std::unique_ptr<Backend> backend;
    try {
      backend = make_backend(name);
    } catch (const BackendError&) {
      continue;
    }
    for (const OpInfo& info : kOpTable) {
      const Case c = cases().at(info.name)(size);
      for (ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
        if (!backend->supports(info.id, dtype))
          continue;
        const RunResult r = run_case(*backend, c, dtype, 20);
        std::printf("%-30s %-8s %-6s %12.2f\n", info.name, name.c_str(), to_string(dtype),
                    1e6 * r.seconds_per_call);
      }
    }
  }
}

}  // namespace
}  // namespace modar::runtime
