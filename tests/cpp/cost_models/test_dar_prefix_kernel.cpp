// dar.kernel = "prefix", the DAR paper's implementation of the depth reads
// (docs/moe.md "The DAR paper's implementation"): the same maths as the fused
// kernels (counted FLOPs unchanged), plus packing of the normalised key views
// and values before each read, their reconstruction in the backward, and the
// retained logits, shifted scores and retrieved states; dar.packs: whether
// the packs are kept for the backward or rebuilt.  Counts by hand for a
// tiny Block DAR (L = 4, K = 2: N = 2 blocks of S = 4 branches, n = 2).
// dar.prefix_memory_efficiency: every dar.* record of the prefix kernels at
// that fraction of the HBM bandwidth, by hand from each record's bytes.
#include <gtest/gtest.h>

#include <string>

#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar {
namespace {

Config tiny_dar(DarKernel kernel) {
  Config c;
  c.model = {.d_model = 64, .n_layers = 4, .n_heads = 4, .vocab_size = 128, .seq_len = 32};
  c.train.micro_batch = 2;  // T = 64 tokens
  c.dar.variant = DarVariant::dar;
  c.dar.block_layers = 2;
  c.dar.streams = 2;
  c.dar.kernel = kernel;
  return c;
}

// Sum of rows x multiplicity of the ops labelled `label` in pass `pass`.
double rows_of(const Config& c, const std::string& label, Pass pass) {
  double rows = 0.0;
  for (const OpRecord& op : lower(c)) {
    if (label == op.label && op.pass == pass) {
      rows += static_cast<double>(op.shape.dims[0] * op.multiplicity);
    }
  }
  return rows;
}

TEST(DarPrefixKernel, PacksEverySourceOfEveryReadForEachStream) {
  // Sources read: block 1 reads H_0 (1), block 2 reads H_0, H_1 (2), the
  // output read H_0..H_2 (3): 6 entries, each n = 2 streams x T = 64 rows.
  const double rows = 6.0 * 2.0 * 64.0;
  const Config prefix = tiny_dar(DarKernel::prefix);
  EXPECT_EQ(rows_of(prefix, "dar.pack_keys", Pass::forward), rows);
  EXPECT_EQ(rows_of(prefix, "dar.pack_values", Pass::forward), rows);
  EXPECT_EQ(rows_of(prefix, "dar.reconstruct_keys", Pass::recompute), rows);
  EXPECT_EQ(rows_of(prefix, "dar.reconstruct_values", Pass::recompute), rows);
  EXPECT_EQ(rows_of(prefix, "dar.pack_keys.bwd", Pass::backward), rows);
  EXPECT_EQ(rows_of(prefix, "dar.pack_values.bwd", Pass::backward), rows);
  // The read's second operand (the value pack): rows x d 64 elements.
  EXPECT_EQ(rows_of(prefix, "dar.prefix.value_pack", Pass::forward), rows * 64.0);
  EXPECT_EQ(rows_of(prefix, "dar.prefix.value_pack.bwd", Pass::backward), rows * 64.0);
  const Config fused = tiny_dar(DarKernel::fused);
  EXPECT_EQ(rows_of(fused, "dar.pack_keys", Pass::forward), 0.0);
  EXPECT_EQ(rows_of(fused, "dar.reconstruct_keys", Pass::recompute), 0.0);
  EXPECT_EQ(rows_of(fused, "dar.prefix.value_pack", Pass::forward), 0.0);
}

TEST(DarPrefixKernel, SameMathsMoreTrafficAndTime) {
  const DeviceProfile h200 = load_profile("h200");
  const Estimate fused = estimate(tiny_dar(DarKernel::fused), h200);
  const Estimate prefix = estimate(tiny_dar(DarKernel::prefix), h200);
  EXPECT_EQ(prefix.flops.forward_per_token, fused.flops.forward_per_token);
  EXPECT_EQ(prefix.flops.backward_per_token, fused.flops.backward_per_token);
  EXPECT_GT(prefix.time.step_s, fused.time.step_s);
}

TEST(DarPrefixKernel, RetainedLogitsScoresAndRetrievedStatesByHand) {
  // (query, source) pairs per stream: block 1 has 2K = 4 queries over 1
  // source, block 2 4 over 2; 2L - N = 6 branches merge one partial; the
  // output read has 1 query over N + 1 = 3.  4 + 8 + 6 + 3 = 21.
  // Logits + shifted scores: 2 x 4 bytes x 21 pairs x n 2 x T 64 = 21504.
  // Retrieved states: (2L + 1) = 9 reads x n 2 x T 64 x d 64 x 2 bytes
  // (bf16) = 147456.
  const DeviceProfile h200 = load_profile("h200");
  const MemoryBreakdown prefix = estimate_memory(tiny_dar(DarKernel::prefix), h200);
  EXPECT_EQ(prefix.dar_retained, 21504.0 + 147456.0);
  const MemoryBreakdown fused = estimate_memory(tiny_dar(DarKernel::fused), h200);
  EXPECT_EQ(fused.dar_retained, 0.0);
  // Nothing else saved changes; the peak carries the retained outputs.
  EXPECT_EQ(prefix.activations, fused.activations);
  EXPECT_EQ(prefix.dar_bank, fused.dar_bank);
  EXPECT_GT(prefix.peak, fused.peak);
}

TEST(DarPrefixKernel, AttnResKeepsNoSecondCopyOfItsBranchInputs) {
  // Block AttnRes (n = 1) on the same shape: 21 (query, source) pairs, so
  // logits + shifted scores 2 x 4 x 21 x T 64 = 10752 bytes.  Retrieved
  // states: the 9 reads less the N = 2 first-in-block reads and the output
  // read, whose retrieved state is the branch input / the final norm's input
  // (saved as activations already): 6 x T 64 x d 64 x 2 bytes = 49152.
  Config attnres = tiny_dar(DarKernel::prefix);
  attnres.dar.variant = DarVariant::attnres;
  attnres.dar.streams = 1;
  const DeviceProfile h200 = load_profile("h200");
  EXPECT_EQ(estimate_memory(attnres, h200).dar_retained, 10752.0 + 49152.0);
}

Config tiny_attnres(DarPacks packs) {
  Config c = tiny_dar(DarKernel::prefix);
  c.dar.variant = DarVariant::attnres;
  c.dar.streams = 1;
  c.dar.packs = packs;
  return c;
}

TEST(DarPrefixKernel, PaperReadingKeepsAttnResPacksAndRebuildsDars) {
  // dar.packs = paper: the AttnRes arm keeps every read's packs (no
  // reconstruction records), DAR rebuilds them (the records above).
  // AttnRes reads 6 entries (1 + 2 phase-1 sources, 3 output sources) of
  // n = 1 stream x T = 64 rows.
  const double rows = 6.0 * 64.0;
  const Config paper = tiny_attnres(DarPacks::paper);
  EXPECT_EQ(rows_of(paper, "dar.pack_keys", Pass::forward), rows);
  EXPECT_EQ(rows_of(paper, "dar.pack_values", Pass::forward), rows);
  EXPECT_EQ(rows_of(paper, "dar.reconstruct_keys", Pass::recompute), 0.0);
  EXPECT_EQ(rows_of(paper, "dar.reconstruct_values", Pass::recompute), 0.0);
  EXPECT_EQ(rows_of(paper, "dar.pack_keys.bwd", Pass::backward), rows);
  const Config rebuilt = tiny_attnres(DarPacks::rebuilt);
  EXPECT_EQ(rows_of(rebuilt, "dar.reconstruct_keys", Pass::recompute), rows);
  EXPECT_EQ(rows_of(rebuilt, "dar.reconstruct_values", Pass::recompute), rows);
  Config dar_kept = tiny_dar(DarKernel::prefix);
  dar_kept.dar.packs = DarPacks::kept;
  EXPECT_EQ(rows_of(dar_kept, "dar.reconstruct_keys", Pass::recompute), 0.0);
}

TEST(DarPrefixKernel, KeptPacksByHand) {
  // Kept: a normalised key view and a value (bf16) of each of the 6 packed
  // entries per stream: 2 x 6 x T 64 x d 64 x 2 bytes = 98304 for AttnRes
  // (n = 1), twice that for DAR (n = 2).  Rebuilt: nothing kept.
  const DeviceProfile h200 = load_profile("h200");
  const MemoryBreakdown paper = estimate_memory(tiny_attnres(DarPacks::paper), h200);
  const MemoryBreakdown rebuilt = estimate_memory(tiny_attnres(DarPacks::rebuilt), h200);
  EXPECT_EQ(paper.dar_packs, 98304.0);
  EXPECT_EQ(rebuilt.dar_packs, 0.0);
  EXPECT_EQ(paper.dar_retained, rebuilt.dar_retained);
  EXPECT_EQ(estimate_memory(tiny_dar(DarKernel::prefix), h200).dar_packs, 0.0);
  Config dar_kept = tiny_dar(DarKernel::prefix);
  dar_kept.dar.packs = DarPacks::kept;
  EXPECT_EQ(estimate_memory(dar_kept, h200).dar_packs, 2.0 * 98304.0);
  // The fused kernels pack nothing, whatever dar.packs says.
  Config fused = tiny_attnres(DarPacks::kept);
  fused.dar.kernel = DarKernel::fused;
  EXPECT_EQ(estimate_memory(fused, h200).dar_packs, 0.0);
  // Keeping skips the rebuild: same FLOPs, less time.
  const Estimate kept_step = estimate(tiny_attnres(DarPacks::paper), h200);
  const Estimate rebuilt_step = estimate(tiny_attnres(DarPacks::rebuilt), h200);
  EXPECT_EQ(kept_step.flops.forward_per_token, rebuilt_step.flops.forward_per_token);
  EXPECT_LT(kept_step.time.step_s, rebuilt_step.time.step_s);
}

TEST(DarPrefixKernel, ConfigKeyRoundTripsAndRejectsUnknownNames) {
  Config c = tiny_dar(DarKernel::fused);
  apply_override(c, "dar.kernel=prefix");
  EXPECT_EQ(c.dar.kernel, DarKernel::prefix);
  EXPECT_STREQ(to_string(c.dar.kernel), "prefix");
  EXPECT_THROW(apply_override(c, "dar.kernel=triton"), std::exception);
  EXPECT_EQ(c.dar.packs, DarPacks::paper);
  apply_override(c, "dar.packs=rebuilt");
  EXPECT_EQ(c.dar.packs, DarPacks::rebuilt);
  EXPECT_STREQ(to_string(c.dar.packs), "rebuilt");
  EXPECT_THROW(apply_override(c, "dar.packs=some"), std::exception);
}

// The prefix kernels' records run at dar.prefix_memory_efficiency x the
// profile's memory bandwidth (the h800 GPU kernel model: a memory-bound op is
// its bytes over that rate plus one launch); every other record keeps its
// family's rate (kernel.memory_efficiency 0.85 on this profile).
TEST(DarPrefixKernel, PrefixRecordsRunAtTheirOwnBandwidthByHand) {
  const DeviceProfile h800 = load_profile("h800-80gb-hgx");
  const TimingModel timing(h800);
  const double launch_s = h800.ceilings.launch_overhead_s;
  const double peak = h800.ceilings.memory_bandwidth;
  Config c = tiny_dar(DarKernel::prefix);
  c.dar.prefix_memory_efficiency = 0.5;
  int dar_records = 0;
  for (const OpRecord& op : lower(c)) {
    TimingModel::Source source = TimingModel::Source::roofline;
    const double seconds = timing.op_time_s(op, &source);
    if (std::string(op.label).rfind("dar.", 0) == 0) {
      ++dar_records;
      EXPECT_DOUBLE_EQ(op.memory_efficiency, 0.5) << op.label;
      EXPECT_NEAR(seconds, launch_s + op.bytes / (0.5 * peak), 1e-15) << op.label;
    } else if (std::string(op.label) == "attn.norm") {
      EXPECT_NEAR(seconds, launch_s + op.bytes / (0.85 * peak), 1e-15);
    }
  }
  EXPECT_GT(dar_records, 20);
  // The fused kernels are modar's own: their records keep the family's rate.
  for (const OpRecord& op : lower(tiny_dar(DarKernel::fused))) {
    EXPECT_EQ(op.memory_efficiency, 0.0) << op.label;
  }
}

// The micro-batch time moves by exactly the dar.* records' bytes over the
// two rates (single device), and not at all with the fused kernels.
TEST(DarPrefixKernel, StepTimeMovesByTheRecordsBytesOverTheRate) {
  const DeviceProfile h800 = load_profile("h800-80gb-hgx");
  Config half = tiny_dar(DarKernel::prefix);
  half.dar.prefix_memory_efficiency = 0.5;
  Config full = half;
  full.dar.prefix_memory_efficiency = 1.0;
  double dar_bytes = 0.0;
  for (const OpRecord& op : lower(half)) {
    if (std::string(op.label).rfind("dar.", 0) == 0) {
      dar_bytes += op.bytes * static_cast<double>(op.multiplicity) * op.weight;
    }
  }
  const double expected_s = dar_bytes / (0.5 * h800.ceilings.memory_bandwidth) -
                            dar_bytes / (1.0 * h800.ceilings.memory_bandwidth);
  const double moved_s =
      estimate(half, h800).time.micro_batch_s - estimate(full, h800).time.micro_batch_s;
  EXPECT_NEAR(moved_s, expected_s, 1e-9 * expected_s);
  Config fused = tiny_dar(DarKernel::fused);
  const double fused_s = estimate(fused, h800).time.step_s;
  fused.dar.prefix_memory_efficiency = 0.5;
  EXPECT_EQ(estimate(fused, h800).time.step_s, fused_s);
}

// The cluster model prices the prefix reads per block (parallel.cpp
// dar_prefix_s) at the same rate: a slower rate slows the pipeline step.
TEST(DarPrefixKernel, ClusterPrefixReadsUseTheSameRate) {
  const DeviceProfile h800 = load_profile("h800-80gb-hgx");
  Config c = tiny_dar(DarKernel::prefix);
  c.parallel.pipeline = 2;
  c.device.count = 2;
  c.train.global_batch = 8;
  const double fast_s = estimate(c, h800).time.step_s;
  c.dar.prefix_memory_efficiency = 0.3;
  EXPECT_GT(estimate(c, h800).time.step_s, fast_s);
}

// The block backward's transient (docs/dar_math.md 5.4) is one formula for
// the single device and a pipeline stage: at p = 1 (two data-parallel ranks,
// each the whole model) the cluster's workspace is the single device's, for
// both kernels; by hand for the fused kernel (T = 64, d = 64, bf16, n = 2,
// N = 2, S = 4): dH 3 n T d B = 49152, phase-1 gradients and outputs
// S n T (2 d B + 4) = 133120, dP and R 4 n T d B = 65536.
TEST(DarPrefixKernel, BlockBackwardTransientAgreesAtOneStage) {
  const DeviceProfile h800 = load_profile("h800-80gb-hgx");
  for (const DarKernel kernel : {DarKernel::fused, DarKernel::prefix}) {
    Config c = tiny_dar(kernel);
    c.train.global_batch = 4;
    const double single = estimate_memory(c, h800).workspace;
    c.device.count = 2;
    const Estimate cluster = estimate(c, h800);
    ASSERT_TRUE(cluster.cluster != nullptr);
    EXPECT_DOUBLE_EQ(cluster.memory.workspace, single) << to_string(kernel);
  }
  Config fused = tiny_dar(DarKernel::fused);
  const double with_dar = estimate_memory(fused, h800).workspace;
  fused.dar.variant = DarVariant::none;
  const double without = estimate_memory(fused, h800).workspace;
  EXPECT_DOUBLE_EQ(with_dar - without, 49152.0 + 133120.0 + 65536.0);
}

TEST(DarPrefixKernel, MemoryEfficiencyKeyRoundTripsAndRejectsOutOfRange) {
  Config c = tiny_dar(DarKernel::prefix);
  EXPECT_DOUBLE_EQ(c.dar.prefix_memory_efficiency, 0.62);
  apply_override(c, "dar.prefix_memory_efficiency=0.7");
  EXPECT_DOUBLE_EQ(c.dar.prefix_memory_efficiency, 0.7);
  EXPECT_DOUBLE_EQ(parse_config_toml(to_toml(c)).dar.prefix_memory_efficiency, 0.7);
  apply_override(c, "dar.prefix_memory_efficiency=1.5");
  try {
    validate(c);
    ADD_FAILURE() << "1.5 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("dar.prefix_memory_efficiency = 1.5"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace modar
