// `modar export --format megatron` (modar/export.hpp, docs/export.md): every
// argument name is one of Megatron-LM's arguments.py (the list below is taken
// from the version docs/export.md cites), every value is derived by hand from
// the configuration, and Megatron-LM arguments read back give the config.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "../common/moe_families.hpp"
#include "modar/base/errors.hpp"
#include "modar/config.hpp"
#include "modar/export.hpp"

namespace modar {
namespace {

// Argument names of megatron/training/arguments.py (docs/export.md's version)
// that the exporter may write.
const std::set<std::string> kMegatronArguments = {"--num-layers",
                                                  "--hidden-size",
                                                  "--ffn-hidden-size",
                                                  "--num-attention-heads",
                                                  "--kv-channels",
                                                  "--group-query-attention",
                                                  "--num-query-groups",
                                                  "--seq-length",
                                                  "--max-position-embeddings",
                                                  "--vocab-size",
                                                  "--make-vocab-size-divisible-by",
                                                  "--position-embedding-type",
                                                  "--normalization",
                                                  "--norm-epsilon",
                                                  "--disable-bias-linear",
                                                  "--add-qkv-bias",
                                                  "--swiglu",
                                                  "--untie-embeddings-and-output-weights",
                                                  "--qk-layernorm",
                                                  "--attention-dropout",
                                                  "--hidden-dropout",
                                                  "--num-experts",
                                                  "--moe-router-topk",
                                                  "--moe-ffn-hidden-size",
                                                  "--moe-shared-expert-intermediate-size",
                                                  "--moe-layer-freq",
                                                  "--moe-grouped-gemm",
                                                  "--moe-token-dispatcher-type",
                                                  "--moe-apply-probs-on-input",
                                                  "--moe-router-load-balancing-type",
                                                  "--moe-aux-loss-coeff",
                                                  "--moe-z-loss-coeff",
                                                  "--moe-expert-capacity-factor",
                                                  "--moe-pad-expert-input-to-capacity",
                                                  "--tensor-model-parallel-size",
                                                  "--sequence-parallel",
                                                  "--pipeline-model-parallel-size",
                                                  "--num-layers-per-virtual-pipeline-stage",
                                                  "--decoder-first-pipeline-num-layers",
                                                  "--decoder-last-pipeline-num-layers",
                                                  "--pipeline-model-parallel-layout",
                                                  "--context-parallel-size",
                                                  "--expert-model-parallel-size",
                                                  "--expert-tensor-parallel-size",
                                                  "--use-megatron-fsdp",
                                                  "--data-parallel-sharding-strategy",
                                                  "--use-distributed-optimizer",
                                                  "--overlap-grad-reduce",
                                                  "--overlap-param-gather",
                                                  "--micro-batch-size",
                                                  "--global-batch-size",
                                                  "--bf16",
                                                  "--fp16",
                                                  "--accumulate-allreduce-grads-in-fp32",
                                                  "--grad-reduce-in-bf16",
                                                  "--recompute-granularity",
                                                  "--recompute-method",
                                                  "--recompute-num-layers",
                                                  "--recompute-modules",
                                                  "--attention-backend",
                                                  "--no-gradient-accumulation-fusion"};

// Mixtral-8x7B's shape (common/moe_families.hpp) on 64 GPUs: TP 2 with SP,
// PP 4 (even split), EP 4, distributed optimizer, micro-batch 1, global
// batch 256.
Config mixtral_layout() {
  Config c = modar_test::mixtral_8x7b();
  c.train = {.micro_batch = 1, .global_batch = 256, .recompute = Recompute::full};
  c.device.count = 64;
  c.parallel = {.tensor = 2,
                .sequence_parallel = true,
                .pipeline = 4,
                .zero = 1,
                .expert = 4,
                .balance_stages = false};
  return c;
}

std::map<std::string, std::string> as_map(const LaunchArguments& args) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : args.flat()) {
    EXPECT_EQ(out.count(name), 0u) << name << " written twice";
    out[name] = value;
  }
  return out;
}

void expect_known_names(const LaunchArguments& args) {
  for (const auto& [name, value] : args.flat()) {
    EXPECT_EQ(kMegatronArguments.count(name), 1u) << name << " is not a Megatron-LM argument";
  }
}

TEST(Export, MixtralLayoutArgumentsAndValues) {
  const LaunchArguments args = megatron_arguments(mixtral_layout());
  expect_known_names(args);
  const std::map<std::string, std::string> a = as_map(args);
  const std::map<std::string, std::string> expected = {
      {"--num-layers", "32"},
      {"--hidden-size", "4096"},
      {"--ffn-hidden-size", "14336"},
      {"--num-attention-heads", "32"},
      {"--kv-channels", "128"},  // 4096 / 32
      {"--group-query-attention", ""},
      {"--num-query-groups", "8"},
      {"--seq-length", "4096"},
      {"--max-position-embeddings", "4096"},
      {"--vocab-size", "32000"},
      {"--make-vocab-size-divisible-by", "1"},  // modar's default: no padding beyond TP
      {"--position-embedding-type", "rope"},
      {"--normalization", "RMSNorm"},
      {"--norm-epsilon", "1e-05"},
      {"--disable-bias-linear", ""},
      {"--swiglu", ""},
      {"--untie-embeddings-and-output-weights", ""},
      {"--attention-dropout", "0.0"},
      {"--hidden-dropout", "0.0"},
      {"--num-experts", "8"},
      {"--moe-router-topk", "2"},
      {"--moe-ffn-hidden-size", "14336"},  // expert_ffn 0: the model's d_ff
      {"--moe-layer-freq", "1"},
      {"--moe-grouped-gemm", ""},
      {"--moe-token-dispatcher-type", "alltoall"},
      {"--moe-router-load-balancing-type", "aux_loss"},
      {"--moe-aux-loss-coeff", "0.02"},
      {"--tensor-model-parallel-size", "2"},
      {"--sequence-parallel", ""},
      {"--pipeline-model-parallel-size", "4"},  // 32 / 4 = 8 layers each: no split argument
      {"--context-parallel-size", "1"},
      {"--expert-model-parallel-size", "4"},
      {"--expert-tensor-parallel-size", "2"},
      {"--use-distributed-optimizer", ""},
      {"--overlap-grad-reduce", ""},
      {"--overlap-param-gather", ""},
      {"--micro-batch-size", "1"},
      {"--global-batch-size", "256"},  // data = 64 / (2 x 4) = 8: 32 micro-batches per rank
      {"--bf16", ""},
      {"--recompute-granularity", "full"},
      {"--recompute-method", "uniform"},
      {"--recompute-num-layers", "1"},
      {"--attention-backend", "flash"},
  };
  EXPECT_EQ(a, expected);
  const std::string text = render_launch_arguments(args);
  EXPECT_NE(text.find("world size 64 GPUs = tensor 2 x pipeline 4 x data 8"), std::string::npos)
      << text;
  EXPECT_NE(text.find("32 micro-batch(es) per step"), std::string::npos) << text;
  EXPECT_NE(text.find("MOE_ARGS=(\n"), std::string::npos);
}

TEST(Export, SharedExpertsDenseLayersAndQwenExtras) {
  Config c = mixtral_layout();
  c.model.n_layers = 28;
  c.model.d_model = 2048;
  c.model.n_heads = 16;
  c.model.n_kv_heads = 0;
  c.model.d_ff = 10944;
  c.model.qkv_bias = true;
  c.model.tie_embeddings = true;
  c.moe.experts = 64;
  c.moe.top_k = 6;
  c.moe.expert_ffn = 1408;
  c.moe.shared_experts = 2;
  c.moe.first_dense = 1;
  c.moe.capacity_factor = 1.25;
  c.parallel.pipeline = 2;
  c.parallel.expert = 8;  // data = 64 / (2 x 2) = 16
  const LaunchArguments args = megatron_arguments(c);
  expect_known_names(args);
  const std::map<std::string, std::string> a = as_map(args);
  EXPECT_EQ(a.at("--moe-shared-expert-intermediate-size"), "2816");  // 2 x 1408
  EXPECT_EQ(a.at("--moe-layer-freq"), "\"([0]*1+[1]*27)\"");
  EXPECT_EQ(a.at("--moe-ffn-hidden-size"), "1408");
  EXPECT_EQ(a.at("--ffn-hidden-size"), "10944");
  EXPECT_EQ(a.at("--moe-expert-capacity-factor"), "1.25");
  EXPECT_EQ(a.count("--moe-pad-expert-input-to-capacity"), 1u);
  EXPECT_EQ(a.count("--add-qkv-bias"), 1u);
  EXPECT_EQ(a.count("--untie-embeddings-and-output-weights"), 0u);
  EXPECT_EQ(a.count("--group-query-attention"), 0u);  // MHA
  // Every other layer MoE from layer 1: the explicit 0/1 list.
  c.moe.interval = 2;
  c.model.n_layers = 6;
  c.parallel.pipeline = 1;
  EXPECT_EQ(as_map(megatron_arguments(c)).at("--moe-layer-freq"), "\"[0,1,0,1,0,1]\"");
}

TEST(Export, PipelineSplits) {
  Config c = mixtral_layout();
  c.moe = MoeConfig{};
  c.parallel.expert = 1;
  // Interleaved, 32 layers over 4 stages x 2 chunks: 4 layers per chunk.
  c.parallel.schedule = PipelineSchedule::interleaved;
  c.parallel.virtual_stages = 2;
  EXPECT_EQ(as_map(megatron_arguments(c)).at("--num-layers-per-virtual-pipeline-stage"), "4");
  // 26 layers over 3 stages (equal chunks, extras first): 9, 9, 8 -> first 9, last 8.
  c.parallel.schedule = PipelineSchedule::one_f_one_b;
  c.parallel.virtual_stages = 1;
  c.parallel.pipeline = 3;
  c.device.count = 6;  // data-parallel size 1: no ZeRO
  c.parallel.zero = 0;
  c.train.global_batch = 0;
  c.model.n_layers = 26;
  std::map<std::string, std::string> a = as_map(megatron_arguments(c));
  EXPECT_EQ(a.at("--decoder-first-pipeline-num-layers"), "9");
  EXPECT_EQ(a.at("--decoder-last-pipeline-num-layers"), "8");
  EXPECT_EQ(a.at("--global-batch-size"), "1");  // micro 1 x data 6 / (2 x 3) = 1
  // 30 layers over 4 stages: 8, 8, 7, 7: the explicit layout.
  c.model.n_layers = 30;
  c.parallel.pipeline = 4;
  c.device.count = 8;
  a = as_map(megatron_arguments(c));
  EXPECT_EQ(a.at("--pipeline-model-parallel-layout"),
            "\"E" + std::string(8, 't') + "|" + std::string(8, 't') + "|" + std::string(7, 't') +
                "|" + std::string(7, 't') + "L\"");
}

TEST(Export, ModarOnlySettingsAreACommentBlock) {
  Config c;
  c.model.n_layers = 8;
  c.mod = {.capacity = 0.125, .every = 2};
  c.dar.variant = DarVariant::dar;
  c.train.recompute = Recompute::selective;
  const LaunchArguments args = megatron_arguments(c);
  expect_known_names(args);
  const std::string text = render_launch_arguments(args);
  EXPECT_NE(text.find("# Not expressible as Megatron-LM arguments"), std::string::npos) << text;
  EXPECT_NE(text.find("#   Mixture-of-Depths: mod.capacity = 0.125, mod.every = 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("#   depth residuals: dar.variant = \"dar\", dar.block_layers = 2"),
            std::string::npos);
  EXPECT_EQ(as_map(args).at("--recompute-modules"), "layernorm");
  // Defaults: GELU (no --swiglu), fp16 / fp32, single device.
  EXPECT_EQ(as_map(args).count("--swiglu"), 0u);
}

TEST(Export, MegatronArgumentsReadBack) {
  const Config planned = mixtral_layout();
  const std::string text = render_launch_arguments(megatron_arguments(planned));
  std::string notes;
  Config back = config_from_megatron_args(text, &notes);
  back.device.count = 64;  // the world size is the launcher's
  back.parallel.balance_stages = false;
  validate(back);
  EXPECT_EQ(config_values(back), config_values(planned)) << to_toml(back);
  EXPECT_NE(notes.find("device.count = 8"), std::string::npos) << notes;
}

// The Megatron-Core settings (docs/config.md): context parallelism, an
// expert tensor size apart from TP, dropout, vocabulary padding, the token
// dispatcher, routing weights on the input, Megatron's own selective
// recompute; written with the values set and read back to the same config.
TEST(Export, MegatronCoreSettingsWrittenAndReadBack) {
  Config c = mixtral_layout();
  c.moe.top_k = 1;  // weights on the input: top-1 only
  c.moe.router_weights = RouterWeights::input;
  c.moe.token_dispatcher = TokenDispatcher::allgather;
  c.model.make_vocab_size_divisible_by = 128;
  c.train.attention_dropout = 0.1;
  c.train.hidden_dropout = 0.1;
  c.train.recompute = Recompute::none;
  c.train.recompute_granularity = RecomputeGranularity::selective;
  c.train.recompute_modules = "core_attn moe_act";
  c.parallel.context = 2;        // data = 64 / (2 x 2 x 4) = 4
  c.parallel.expert_tensor = 1;  // EP 4 x ETP 1 folds over the t x c x d = 16 ranks of a stage
  c.train.global_batch = 64;
  validate(c);
  const LaunchArguments args = megatron_arguments(c);
  expect_known_names(args);
  const std::map<std::string, std::string> a = as_map(args);
  EXPECT_EQ(a.at("--context-parallel-size"), "2");
  EXPECT_EQ(a.at("--expert-tensor-parallel-size"), "1");
  EXPECT_EQ(a.at("--make-vocab-size-divisible-by"), "128");  // 32000 = 125 x 256: no padding
  EXPECT_EQ(a.at("--attention-dropout"), "0.1");
  EXPECT_EQ(a.at("--hidden-dropout"), "0.1");
  EXPECT_EQ(a.at("--moe-token-dispatcher-type"), "allgather");
  EXPECT_EQ(a.count("--moe-apply-probs-on-input"), 1u);
  EXPECT_EQ(a.at("--recompute-granularity"), "selective");
  EXPECT_EQ(a.at("--recompute-modules"), "core_attn moe_act");
  EXPECT_EQ(a.count("--recompute-method"), 0u);
  // 64 sequences / (micro-batch 1 x data 4) = 16 micro-batches per rank.
  EXPECT_NE(render_launch_arguments(args).find("16 micro-batch(es) per step"), std::string::npos);
  std::string notes;
  Config back = config_from_megatron_args(render_launch_arguments(args), &notes);
  EXPECT_NE(notes.find("device.count = 16"), std::string::npos) << notes;  // t 2 x c 2 x p 4
  back.device.count = 64;
  back.parallel.balance_stages = false;
  validate(back);
  EXPECT_EQ(config_values(back), config_values(c)) << to_toml(back);
  // Megatron-LM's defaults where a command line is silent: dropout 0.1,
  // vocabulary padded to 128 x TP, selective recompute of core attention.
  const Config plain = config_from_megatron_args(
      "--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
      "--vocab-size 50257 --tensor-model-parallel-size 2 --recompute-activations");
  EXPECT_EQ(plain.train.attention_dropout, 0.1);
  EXPECT_EQ(plain.train.hidden_dropout, 0.1);
  EXPECT_EQ(plain.model.padded_vocab(2), 50432);  // 50257 up to a multiple of 256 = 197 x 256
  EXPECT_EQ(plain.train.recompute_granularity, RecomputeGranularity::selective);
  EXPECT_EQ(plain.train.recompute_modules, "core_attn");
  EXPECT_EQ(plain.train.recompute, Recompute::none);
}

// train.grad_reduce_in_fp32: written only where it is not Megatron's default
// for the dtype (bf16 forces fp32 main gradients, fp16 keeps fp16 without
// --accumulate-allreduce-grads-in-fp32), and read back.
TEST(Export, MainGradientDtypeWrittenAndReadBack) {
  for (const auto& [dtype, setting, flag] :
       {std::tuple{DType::fp16, GradReduceInFp32::fp32, "--accumulate-allreduce-grads-in-fp32"},
        std::tuple{DType::bf16, GradReduceInFp32::param_dtype, "--grad-reduce-in-bf16"}}) {
    Config c = mixtral_layout();
    c.train.dtype = dtype;
    const std::map<std::string, std::string> plain = as_map(megatron_arguments(c));
    EXPECT_EQ(plain.count("--accumulate-allreduce-grads-in-fp32"), 0u);
    EXPECT_EQ(plain.count("--grad-reduce-in-bf16"), 0u);
    c.train.grad_reduce_in_fp32 = setting;
    const LaunchArguments args = megatron_arguments(c);
    expect_known_names(args);
    EXPECT_EQ(as_map(args).count(flag), 1u) << flag;
    const Config back = config_from_megatron_args(render_launch_arguments(args));
    EXPECT_EQ(back.train.grad_reduce_in_fp32, setting) << flag;
    EXPECT_EQ(back.train.dtype, dtype) << flag;
  }
}

TEST(Export, ACommandLineReadAsAConfig) {
  std::string notes;
  const Config c = config_from_megatron_args(
      "torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py \\\n"
      "  --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \\\n"
      "  --max-position-embeddings 2048 --micro-batch-size 2 --global-batch-size 64 \\\n"
      "  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\\n"
      "  --num-layers-per-virtual-pipeline-stage 3 --use-distributed-optimizer \\\n"
      "  --num-experts 16 --moe-router-topk 4 --moe-layer-freq '([0]*2+[1]*22)' \\\n"
      "  --lr 3e-4 --data-path /data/corpus --vocab-size 50257 --bf16",
      &notes);
  EXPECT_EQ(c.device.count, 16);  // 8 x 2 from torchrun
  EXPECT_EQ(c.model.n_layers, 24);
  EXPECT_EQ(c.model.mlp, MlpKind::gelu);    // no --swiglu: Megatron-LM's default
  EXPECT_TRUE(c.model.tie_embeddings);      // no --untie-...
  EXPECT_EQ(c.parallel.virtual_stages, 4);  // 24 / 2 = 12 per stage, 3 per chunk
  EXPECT_EQ(c.parallel.schedule, PipelineSchedule::interleaved);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_FALSE(c.parallel.overlap_grad_reduce);
  EXPECT_EQ(c.moe.first_dense, 2);
  EXPECT_EQ(c.moe.interval, 1);
  EXPECT_NO_THROW(validate(c));
  EXPECT_NE(notes.find("not modelled: --data-path, --lr"), std::string::npos) << notes;
  EXPECT_NE(notes.find("no --disable-bias-linear"), std::string::npos);
  auto error = [](const std::string& text) {
    try {
      config_from_megatron_args(text);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("--num-layers abc"),
            "--num-layers = abc: must be an integer (Megatron-LM arguments)");
  EXPECT_NE(error("--moe-token-dispatcher-type flex").find("alltoall and allgather"),
            std::string::npos);
  EXPECT_NE(error("--num-layers 4 --num-experts 4 --moe-layer-freq \"[1,0,1,1]\"")
                .find("--moe-layer-freq"),
            std::string::npos);
  EXPECT_NE(error("--num-layers 4 --num-experts 4 --moe-layer-freq \"([1]*5\"").find("pattern"),
            std::string::npos);
  EXPECT_NE(error("--seq-length 'unclosed").find("quote"), std::string::npos);
}

}  // namespace
}  // namespace modar
