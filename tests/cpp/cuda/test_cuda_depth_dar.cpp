// AttnRes / DAR on the GPU: depth-read prefix (online softmax over sources)
// forward / backward including dlse and the shared key / value tensor, the
// closed-form merge, the DAR coefficient head (n = 2 closed-form transport,
// n = 3 Sinkhorn), the stream mix, and the transport / gated write.
// CUDA vs CPU with the FlashAttention rule.
#include "cuda_test_util.hpp"

namespace modar::runtime::cuda_testing {
namespace {

// rstd of each [d] row (eps 1e-6), from values rounded to the tested precision.
std::vector<double> row_rstd(const std::vector<double>& x, int64_t d, Precision p) {
  const ScalarType lowp = p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
  std::vector<double> out(x.size() / static_cast<size_t>(d));
  for (size_t r = 0; r < out.size(); ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < d; ++c) {
      const double v = round_to(x[r * static_cast<size_t>(d) + static_cast<size_t>(c)], lowp);
      sum += v * v;
    }
    out[r] = 1.0 / std::sqrt(sum / static_cast<double>(d) + 1e-6);
  }
  return out;
}

struct PrefixForward {
  std::vector<double> out, lse;
};

// The forward in fp64 on the CPU (the saved tensors of the backward).
PrefixForward prefix_forward_fp64(const std::vector<double>& keys, const std::vector<double>& rstd,
                                  const std::vector<double>& values,
                                  const std::vector<double>& queries, int64_t sources,
                                  int64_t tokens, int64_t q_count, int64_t d, Precision p) {
  const ScalarType lowp = p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
  auto rounded = [](std::vector<double> x, ScalarType type) {
    for (double& e : x)
      e = round_to(e, type);
    return x;
  };
  Tensor k = make_tensor(cpu(), {sources, tokens, d}, ScalarType::fp64, rounded(keys, lowp));
  Tensor r =
      make_tensor(cpu(), {sources, tokens}, ScalarType::fp64, rounded(rstd, ScalarType::fp32));
  Tensor v = make_tensor(cpu(), {sources, tokens, d}, ScalarType::fp64, rounded(values, lowp));
  Tensor q = make_tensor(cpu(), {q_count, d}, ScalarType::fp64, rounded(queries, ScalarType::fp32));
  Tensor out = make_tensor(cpu(), {q_count, tokens, d}, ScalarType::fp64);
  Tensor lse = make_tensor(cpu(), {q_count, tokens}, ScalarType::fp64);
  cpu().depth_read_prefix_forward(k, r, v, q, out, lse);
  return {download(cpu(), out), download(cpu(), lse)};
}

TEST(CudaDepthRead, PrefixForwardBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  struct Case {
    int64_t sources, tokens, queries, d;
  };
  // The last case: a real sequence (T = 8192 tokens, more than the backward's
  // kDepthReadBlocks = 264 token blocks, so each block loops over ~31 tokens).
  const Case cases[] = {{1, 5, 1, 64},     {3, 17, 4, 200}, {9, 40, 8, 512},
                        {5, 3, 2, 2304},   {4, 8192, 2, 64}};
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const int64_t bank = c.sources * c.tokens * c.d;
    const auto keys = random_values(bank, seed, -2.0, 2.0);
    const auto values = random_values(bank, seed + 1, -2.0, 2.0);
    const auto queries = random_values(c.queries * c.d, seed + 2, -0.3, 0.3);
    const std::string label = "depth_read_prefix R=" + std::to_string(c.sources) +
                              " T=" + std::to_string(c.tokens) + " Q=" + std::to_string(c.queries) +
                              " d=" + std::to_string(c.d);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      const auto rstd = row_rstd(keys, c.d, p);
      expect_matches_cpu(
          label, p,
          {data("keys", {c.sources, c.tokens, c.d}, keys),
           stat("rstd", {c.sources, c.tokens}, rstd),
           data("values", {c.sources, c.tokens, c.d}, values),
           stat("queries", {c.queries, c.d}, queries), out_data("out", {c.queries, c.tokens, c.d}),
           out_stat("lse", {c.queries, c.tokens})},
          [](Backend& be, const std::vector<TensorView>& v) {
            be.depth_read_prefix_forward(v[0], v[1], v[2], v[3], v[4], v[5]);
          });
      const PrefixForward saved =
          prefix_forward_fp64(keys, rstd, values, queries, c.sources, c.tokens, c.queries, c.d, p);
      const int64_t out_count = c.queries * c.tokens * c.d;
      expect_matches_cpu(
          label + " backward", p,
          {data("dout", {c.queries, c.tokens, c.d}, random_values(out_count, seed + 3)),
           stat("dlse", {c.queries, c.tokens}, random_values(c.queries * c.tokens, seed + 4)),
           data("keys", {c.sources, c.tokens, c.d}, keys),
           stat("rstd", {c.sources, c.tokens}, rstd),
           data("values", {c.sources, c.tokens, c.d}, values),
           stat("queries", {c.queries, c.d}, queries),
           data("out", {c.queries, c.tokens, c.d}, saved.out),
           stat("lse", {c.queries, c.tokens}, saved.lse),
           grad_data("dkeys", {c.sources, c.tokens, c.d}, random_values(bank, seed + 5)),
           grad_data("dvalues", {c.sources, c.tokens, c.d}, random_values(bank, seed + 6)),
           grad_stat("dqueries", {c.queries, c.d}, random_values(c.queries * c.d, seed + 7))},
          [](Backend& be, const std::vector<TensorView>& v) {
            be.depth_read_prefix_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8],
                                          v[9], v[10]);
          });
      // AttnRes: keys and values are the same tensor, and so are their gradients;
      // no dlse (no merge downstream).
      const PrefixForward shared =
          prefix_forward_fp64(keys, rstd, keys, queries, c.sources, c.tokens, c.queries, c.d, p);
      expect_matches_cpu(
          label + " backward shared key/value", p,
          {data("dout", {c.queries, c.tokens, c.d}, random_values(out_count, seed + 8)),
           data("bank", {c.sources, c.tokens, c.d}, keys),
           stat("rstd", {c.sources, c.tokens}, rstd), stat("queries", {c.queries, c.d}, queries),
           data("out", {c.queries, c.tokens, c.d}, shared.out),
           stat("lse", {c.queries, c.tokens}, shared.lse),
           grad_data("dbank", {c.sources, c.tokens, c.d}, random_values(bank, seed + 9))},
          [](Backend& be, const std::vector<TensorView>& v) {
            be.depth_read_prefix_backward(v[0], TensorView{}, v[1], v[2], v[1], v[3], v[4], v[5],
                                          v[6], v[6], TensorView{});
          });
    }
    seed += 100;
  }
}

TEST(CudaDepthRead, MergeForwardBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  // (tokens, d): small rows, a wide row, and a real sequence of 8192 tokens.
  for (const auto& [tokens, d] : {std::pair<int64_t, int64_t>{29, 64}, {29, 1000}, {8192, 96}}) {
    const auto prefix = random_values(tokens * d, 1);
    const auto keys = random_values(tokens * d, 2, -2.0, 2.0);
    const auto values = random_values(tokens * d, 3);
    const auto query = random_values(d, 4, -0.2, 0.2);
    const auto lse = random_values(tokens, 5, -1.0, 2.0);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      const auto rstd = row_rstd(keys, d, p);
      const std::string label =
          "depth_read_merge T=" + std::to_string(tokens) + " d=" + std::to_string(d);
      expect_matches_cpu(label, p,
                         {data("prefix_out", {tokens, d}, prefix), stat("lse", {tokens}, lse),
                          data("keys", {tokens, d}, keys), stat("rstd", {tokens}, rstd),
                          data("values", {tokens, d}, values), stat("query", {d}, query),
                          out_data("out", {tokens, d}), out_stat("weight", {tokens})},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.depth_read_merge_forward(v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                                                       v[7]);
                         });
      // A consistent p = sigmoid(s_P - lse) for the backward, in fp64.
      std::vector<double> weight(static_cast<size_t>(tokens));
      const ScalarType lowp = p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
      for (int64_t t = 0; t < tokens; ++t) {
        double s = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          s += round_to(query[static_cast<size_t>(c)], ScalarType::fp32) *
               round_to(keys[static_cast<size_t>(t * d + c)], lowp);
        }
        s *= round_to(rstd[static_cast<size_t>(t)], ScalarType::fp32);
        weight[static_cast<size_t>(t)] =
            1.0 / (1.0 + std::exp(-(s - round_to(lse[static_cast<size_t>(t)], ScalarType::fp32))));
      }
      expect_matches_cpu(label + " backward", p,
                         {data("dout", {tokens, d}, random_values(tokens * d, 6)),
                          data("prefix_out", {tokens, d}, prefix), data("keys", {tokens, d}, keys),
                          stat("rstd", {tokens}, rstd), data("values", {tokens, d}, values),
                          stat("query", {d}, query), stat("weight", {tokens}, weight),
                          grad_data("dprefix_out", {tokens, d}, random_values(tokens * d, 7)),
                          grad_stat("dlse", {tokens}, random_values(tokens, 8)),
                          grad_data("dkeys", {tokens, d}, random_values(tokens * d, 9)),
                          grad_data("dvalues", {tokens, d}, random_values(tokens * d, 10)),
                          grad_stat("dquery", {d}, random_values(d, 11))},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.depth_read_merge_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                                                        v[7], v[8], v[9], v[10], v[11]);
                         });
    }
  }
}

TEST(CudaDar, CoefficientsForwardBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  struct Case {
    int64_t n, tokens, d;
    bool transport;
  };
  const Case cases[] = {{2, 23, 128, true}, {2, 9, 96, false}, {3, 11, 64, true}, {4, 5, 40, true}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const int64_t outputs = 2 * c.n + (c.transport ? (c.n == 2 ? 1 : c.n * c.n) : 0);
    const int64_t width = c.n * c.d;
    const auto retrieved = random_values(c.n * c.tokens * c.d, seed, -2.0, 2.0);
    const auto weight = random_values(width * outputs, seed + 1, -0.1, 0.1);
    const auto bias = random_values(outputs, seed + 2, -0.5, 0.5);
    const std::vector<double> scale = {0.8, 1.3, 0.6};
    DarCoefficientParams params;
    params.sinkhorn_iterations = 8;
    const std::string label = "dar_coefficients n=" + std::to_string(c.n) +
                              (c.transport ? " with transport" : " no transport");
    const Arg transport_out = c.transport ? out_stat("transport", {c.tokens, c.n, c.n}) : none();
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      expect_matches_cpu(
          label, p,
          {data("retrieved", {c.n, c.tokens, c.d}, retrieved),
           stat("weight", {width, outputs}, weight), stat("bias", {outputs}, bias),
           stat("scale", {3}, scale), out_stat("alpha", {c.tokens, c.n}),
           out_stat("beta", {c.tokens, c.n}), transport_out, out_stat("z_rstd", {c.tokens})},
          [&](Backend& be, const std::vector<TensorView>& v) {
            be.dar_coefficients_forward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], params);
          });
      // Saved forward outputs, in fp64 on the CPU.
      const ScalarType lowp = p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
      std::vector<double> r_rounded = retrieved;
      for (double& x : r_rounded)
        x = round_to(x, lowp);
      auto f32 = [](std::vector<double> x) {
        for (double& e : x)
          e = round_to(e, ScalarType::fp32);
        return x;
      };
      Tensor rt = make_tensor(cpu(), {c.n, c.tokens, c.d}, ScalarType::fp64, r_rounded);
      Tensor wt = make_tensor(cpu(), {width, outputs}, ScalarType::fp64, f32(weight));
      Tensor bt = make_tensor(cpu(), {outputs}, ScalarType::fp64, f32(bias));
      Tensor st = make_tensor(cpu(), {3}, ScalarType::fp64, f32(scale));
      Tensor at = make_tensor(cpu(), {c.tokens, c.n}, ScalarType::fp64);
      Tensor bet = make_tensor(cpu(), {c.tokens, c.n}, ScalarType::fp64);
      Tensor mt = make_tensor(cpu(), {c.tokens, c.n, c.n}, ScalarType::fp64);
      Tensor zt = make_tensor(cpu(), {c.tokens}, ScalarType::fp64);
      cpu().dar_coefficients_forward(rt, wt, bt, st, at, bet,
                                     c.transport ? mt.view() : TensorView{}, zt, params);
      const Arg transport_in =
          c.transport ? stat("transport", {c.tokens, c.n, c.n}, download(cpu(), mt)) : none();
      const Arg dtransport = c.transport ? stat("dtransport", {c.tokens, c.n, c.n},
                                                random_values(c.tokens * c.n * c.n, seed + 3))
                                         : none();
      expect_matches_cpu(
          label + " backward", p,
          {stat("dalpha", {c.tokens, c.n}, random_values(c.tokens * c.n, seed + 4)),
           stat("dbeta", {c.tokens, c.n}, random_values(c.tokens * c.n, seed + 5)), dtransport,
           data("retrieved", {c.n, c.tokens, c.d}, retrieved),
           stat("weight", {width, outputs}, weight), stat("bias", {outputs}, bias),
           stat("scale", {3}, scale), stat("alpha", {c.tokens, c.n}, download(cpu(), at)),
           stat("beta", {c.tokens, c.n}, download(cpu(), bet)), transport_in,
           stat("z_rstd", {c.tokens}, download(cpu(), zt)),
           grad_data("dretrieved", {c.n, c.tokens, c.d}, random_values(c.n * c.tokens * c.d, 6)),
           grad_stat("dweight", {width, outputs}, random_values(width * outputs, 7)),
           grad_stat("dbias", {outputs}, random_values(outputs, 8)),
           grad_stat("dscale", {3}, random_values(3, 9))},
          [&](Backend& be, const std::vector<TensorView>& v) {
            be.dar_coefficients_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9],
                                         v[10], v[11], v[12], v[13], v[14], params);
          });
    }
    seed += 100;
  }
}

TEST(CudaDar, MixAndWriteMatchCpu) {
  MODAR_REQUIRE_CUDA();
  for (const int64_t n : {int64_t{2}, int64_t{3}}) {
    const int64_t tokens = 21, d = 160;
    const int64_t plane = n * tokens * d;
    const auto retrieved = random_values(plane, 1);
    const auto alpha = random_values(tokens * n, 2, 0.0, 1.0);
    const auto transport = random_values(tokens * n * n, 3, 0.0, 1.0);
    const auto partial = random_values(plane, 4);
    const auto beta = random_values(tokens * n, 5, 0.0, 2.0);
    const auto y = random_values(tokens * d, 6);
    const std::string suffix = " n=" + std::to_string(n);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      expect_matches_cpu("dar_mix" + suffix, p,
                         {data("retrieved", {n, tokens, d}, retrieved),
                          stat("alpha", {tokens, n}, alpha), out_data("out", {tokens, d})},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.dar_mix_forward(v[0], v[1], v[2]);
                         });
      expect_matches_cpu(
          "dar_mix backward" + suffix, p,
          {data("dout", {tokens, d}, random_values(tokens * d, 7)),
           data("retrieved", {n, tokens, d}, retrieved), stat("alpha", {tokens, n}, alpha),
           grad_data("dretrieved", {n, tokens, d}, random_values(plane, 8)),
           grad_stat("dalpha", {tokens, n}, random_values(tokens * n, 9))},
          [](Backend& be, const std::vector<TensorView>& v) {
            be.dar_mix_backward(v[0], v[1], v[2], v[3], v[4]);
          });
      // Full write, first branch of a block (no transport), pure transport.
      for (int mode = 0; mode < 3; ++mode) {
        const bool with_transport = mode != 1;
        const bool with_write = mode != 2;
        const std::string name =
            mode == 0 ? "dar_write" : (mode == 1 ? "dar_write first" : "dar_transport");
        const Arg m_arg = with_transport ? stat("transport", {tokens, n, n}, transport) : none();
        const Arg p_arg = with_transport ? data("partial", {n, tokens, d}, partial) : none();
        const Arg b_arg = with_write ? stat("beta", {tokens, n}, beta) : none();
        const Arg y_arg = with_write ? data("y", {tokens, d}, y) : none();
        expect_matches_cpu(name + suffix, p,
                           {m_arg, p_arg, b_arg, y_arg, out_data("out", {n, tokens, d})},
                           [](Backend& be, const std::vector<TensorView>& v) {
                             be.dar_write_forward(v[0], v[1], v[2], v[3], v[4]);
                           });
        expect_matches_cpu(
            name + " backward" + suffix, p,
            {data("dout", {n, tokens, d}, random_values(plane, 10)), m_arg, p_arg, b_arg, y_arg,
             with_transport
                 ? grad_stat("dtransport", {tokens, n, n}, random_values(tokens * n * n, 11))
                 : none(),
             with_transport ? grad_data("dpartial", {n, tokens, d}, random_values(plane, 12))
                            : none(),
             with_write ? grad_stat("dbeta", {tokens, n}, random_values(tokens * n, 13)) : none(),
             with_write ? grad_data("dy", {tokens, d}, random_values(tokens * d, 14)) : none()},
            [](Backend& be, const std::vector<TensorView>& v) {
              be.dar_write_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]);
            });
      }
    }
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
