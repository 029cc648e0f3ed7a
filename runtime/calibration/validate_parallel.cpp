// runtime/calibration/validate_parallel.cpp: `modar validate --parallel`
// (modar/runtime/validate_parallel.hpp): the multi-process training steps
// under mpirun, measured through a timing decorator of the communicator and
// replayed on dedicated cores, against the planner's cluster estimate.
#include "modar/runtime/validate_parallel.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "modar/base/clock.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/json.hpp"
#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"
#include "modar/runtime/forwarding_communicator.hpp"
#include "modar/runtime/host_facts.hpp"
#include "modar/runtime/model.hpp"
#include "modar/runtime/parallel_steps.hpp"
#include "modar/runtime/profiler.hpp"
#include "validate_internal.hpp"

namespace modar::runtime {
namespace {

constexpr int kMaxWorld = 32;  // group ids carry a member bit mask of 32 bits

// ---- the timing decorator -------------------------------------------------------

// What one rank records while a step runs (shared by the world's wrapper and
// every sub-communicator split from it).
class Recorder {
 public:
  explicit Recorder(int world_rank) : world_rank_(world_rank) {}
  int world_rank() const { return world_rank_; }

  int64_t next_ordinal(uint64_t mask) { return ordinals_[mask]++; }

  void start() {
    calls_.clear();
    collective_seq_.clear();
    send_seq_.clear();
    recv_seq_.clear();
    wall_in_calls_s_ = 0.0;
    recording_ = true;
    wall_start_s_ = steady_now_s();
    last_cpu_s_ = process_cpu_s();
  }
  void stop() {
    compute_after_s_ = process_cpu_s() - last_cpu_s_;
    wall_step_s_ = steady_now_s() - wall_start_s_;
    recording_ = false;
  }

  struct Open {
    double cpu_s = 0.0, wall_s = 0.0;
  };
  Open begin() const {
    Open open;
    if (recording_) {
      open.cpu_s = process_cpu_s();
      open.wall_s = steady_now_s();
    }
    return open;
  }
  // group: the communicator's id; send_to / recv_from world ranks or -1.
  void end(const Open& open, int64_t group, bool collective, int send_to, int recv_from) {
    if (!recording_) {
      return;
    }
    TimelineCall call;
    call.wall_start_s = open.wall_s;
    call.wall_end_s = steady_now_s();
    call.compute_before_s = std::max(0.0, open.cpu_s - last_cpu_s_);
    last_cpu_s_ = process_cpu_s();
    call.group = group;
    call.collective = collective;
    if (collective) {
      call.sequence = collective_seq_[group]++;
    }
    call.send_to = send_to;
    call.recv_from = recv_from;
    if (send_to >= 0) {
      call.send_sequence = send_seq_[{group, send_to}]++;
    }
    if (recv_from >= 0) {
      call.recv_sequence = recv_seq_[{group, recv_from}]++;
    }
    wall_in_calls_s_ += call.wall_end_s - call.wall_start_s;
    calls_.push_back(call);
  }

  // [wall_step, wall_in_calls, compute_after, n, 10 per call]
  std::vector<double> serialize(double peak_bytes) const {
    std::vector<double> out = {peak_bytes, wall_step_s_, wall_in_calls_s_, compute_after_s_,
                               static_cast<double>(calls_.size())};
    for (const TimelineCall& c : calls_) {
      out.insert(out.end(), {static_cast<double>(c.group), c.collective ? 1.0 : 0.0,
                             static_cast<double>(c.sequence), static_cast<double>(c.send_to),
                             static_cast<double>(c.recv_from), static_cast<double>(c.send_sequence),
                             static_cast<double>(c.recv_sequence), c.compute_before_s,
                             c.wall_start_s, c.wall_end_s});
    }
    return out;
  }

 private:
  int world_rank_ = 0;
  bool recording_ = false;
  std::vector<TimelineCall> calls_;
  std::map<uint64_t, int64_t> ordinals_;
  std::map<int64_t, int64_t> collective_seq_;
  std::map<std::pair<int64_t, int>, int64_t> send_seq_, recv_seq_;
  double last_cpu_s_ = 0.0, wall_start_s_ = 0.0, wall_step_s_ = 0.0, wall_in_calls_s_ = 0.0;
  double compute_after_s_ = 0.0;
};

// A Communicator that forwards every call to the real one and records it
// (ForwardingCommunicator: one hook sees every call).
class TimingCommunicator final : public ForwardingCommunicator {
 public:
  TimingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<Recorder> recorder,
                     std::vector<int> world_ranks)
      : ForwardingCommunicator(std::move(inner)),
        recorder_(std::move(recorder)),
        world_ranks_(std::move(world_ranks)) {
    uint64_t mask = 0;
    for (const int r : world_ranks_) {
      mask |= uint64_t{1} << r;
    }
    // id = ordinal x 2^32 + member mask: exact in the fp64 records up to 2^21
    // communicators of one membership.
    group_ = recorder_->next_ordinal(mask) * (int64_t{1} << kMaxWorld) + static_cast<int64_t>(mask);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> part = inner().split(color, key);
    if (!part) {
      return nullptr;
    }
    // The new group's world ranks, in its rank order (set-up only, untimed).
    std::vector<int32_t> mine = {recorder_->world_rank()};
    std::vector<int32_t> all(static_cast<size_t>(part->size()));
    part->all_gather(make_view(mine.data(), ScalarType::i32, DeviceKind::cpu, {1}),
                     make_view(all.data(), ScalarType::i32, DeviceKind::cpu,
                               {static_cast<int64_t>(all.size())}));
    return std::make_unique<TimingCommunicator>(std::move(part), recorder_,
                                                std::vector<int>(all.begin(), all.end()));
  }

 protected:
  void observe(const CommCall& call, const std::function<void()>& run) override {
    const auto open = recorder_->begin();
    run();
    recorder_->end(open, group_, is_collective(call.op), world(call.send_peer),
                   world(call.recv_peer));
  }

 private:
  int world(int peer) const { return peer < 0 ? -1 : world_ranks_.at(static_cast<size_t>(peer)); }

  std::shared_ptr<Recorder> recorder_;
  std::vector<int> world_ranks_;
  int64_t group_ = 0;
};

std::vector<int> members_of(int64_t group) {
  const uint64_t mask = static_cast<uint64_t>(group % (int64_t{1} << kMaxWorld));
  std::vector<int> members;
  for (int r = 0; r < kMaxWorld; ++r) {
    if ((mask >> r) & 1U) {
      members.push_back(r);
    }
  }
  return members;
}

struct RankRound {
  double peak_bytes = 0.0, wall_step_s = 0.0, wall_in_calls_s = 0.0;
  RankTimeline timeline;
};

RankRound deserialize(const double* data) {
  RankRound out;
  out.peak_bytes = data[0];
  out.wall_step_s = data[1];
  out.wall_in_calls_s = data[2];
  out.timeline.compute_after_s = data[3];
  const auto n = static_cast<size_t>(data[4]);
  const double* p = data + 5;
  for (size_t i = 0; i < n; ++i, p += 10) {
    TimelineCall c;
    c.group = static_cast<int64_t>(p[0]);
    c.collective = p[1] != 0.0;
    c.sequence = static_cast<int64_t>(p[2]);
    c.send_to = static_cast<int>(p[3]);
    c.recv_from = static_cast<int>(p[4]);
    c.send_sequence = static_cast<int64_t>(p[5]);
    c.recv_sequence = static_cast<int64_t>(p[6]);
    c.compute_before_s = p[7];
    c.wall_start_s = p[8];
    c.wall_end_s = p[9];
    c.members = members_of(c.group);
    out.timeline.calls.push_back(std::move(c));
  }
  return out;
}

// Every rank's record of one step, on every rank (all-gather over the real
// world communicator: untimed).
std::vector<RankRound> gather_round(Communicator& world, const std::vector<double>& mine) {
  const int p = world.size();
  double count = static_cast<double>(mine.size());
  std::vector<double> counts(static_cast<size_t>(p));
  world.all_gather(make_view(&count, ScalarType::fp64, DeviceKind::cpu, {1}),
                   make_view(counts.data(), ScalarType::fp64, DeviceKind::cpu, {p}));
  const auto width = static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
  std::vector<double> padded = mine;
  padded.resize(static_cast<size_t>(width), 0.0);
  std::vector<double> all(static_cast<size_t>(width * p));
  world.all_gather(make_view(padded.data(), ScalarType::fp64, DeviceKind::cpu, {width}),
                   make_view(all.data(), ScalarType::fp64, DeviceKind::cpu, {width * p}));
  std::vector<RankRound> out;
  for (int r = 0; r < p; ++r) {
    out.push_back(deserialize(all.data() + static_cast<size_t>(r) * static_cast<size_t>(width)));
  }
  return out;
}

// ---- cases ----------------------------------------------------------------------

// Off the profile's grid axes (powers of 4 from 16): d 192, d_ff 768, seq
// 128, vocab 384, d_h 48.  A small vocabulary keeps the head, which the
// runtime's tensor-parallel trainer replicates (the planner models a
// vocab-parallel head), a few percent of the step.
Config parallel_model(const std::string& model) {
  Config c;
  c.model.d_model = 192;
  c.model.n_layers = 4;
  c.model.n_heads = 4;
  c.model.seq_len = 128;
  c.model.vocab_size = 384;
  c.model.mlp = MlpKind::gelu;
  c.train.dtype = DType::fp32;
  if (model == "mod" || model == "moddar") {
    c.mod.every = 2;
    c.mod.offset = 1;
    c.mod.capacity = 0.25;  // k = 32 = s / 4: fits a sequence-parallel shard at t = 4
    c.mod.causal_router = CausalRouter::aux_loss;
  }
  if (model == "moddar") {
    c.dar.variant = DarVariant::dar;
    c.dar.block_layers = 2;
  }
  return c;
}

constexpr int64_t kGlobalBatch = 4;

}  // namespace

// ---- the replay -------------------------------------------------------------------

std::vector<ReplayedRank> replay_timeline(const std::vector<RankTimeline>& ranks) {
  struct Ref {
    size_t rank, call;
  };
  const size_t P = ranks.size();
  std::map<std::pair<int64_t, int64_t>, std::vector<Ref>> collectives;
  std::map<std::tuple<int64_t, int, int, int64_t>, Ref> sends, recvs;
  for (size_t r = 0; r < P; ++r) {
    for (size_t i = 0; i < ranks[r].calls.size(); ++i) {
      const TimelineCall& c = ranks[r].calls[i];
      if (c.collective) {
        collectives[{c.group, c.sequence}].push_back({r, i});
        continue;
      }
      if (c.send_to >= 0) {
        sends[{c.group, static_cast<int>(r), c.send_to, c.send_sequence}] = {r, i};
      }
      if (c.recv_from >= 0) {
        recvs[{c.group, c.recv_from, static_cast<int>(r), c.recv_sequence}] = {r, i};
      }
    }
  }
  const auto unmatched = [](size_t r, size_t i, const std::string& what) {
    return std::runtime_error("replay: rank " + std::to_string(r) + " call " + std::to_string(i) +
                              ": " + what);
  };
  // The participants of every call (itself included).
  std::vector<std::vector<std::vector<Ref>>> partners(P);
  for (size_t r = 0; r < P; ++r) {
    partners[r].resize(ranks[r].calls.size());
    for (size_t i = 0; i < ranks[r].calls.size(); ++i) {
      const TimelineCall& c = ranks[r].calls[i];
      std::vector<Ref>& with = partners[r][i];
      if (c.collective) {
        with = collectives[{c.group, c.sequence}];
        if (!c.members.empty() && with.size() != c.members.size()) {
          throw unmatched(r, i,
                          "collective " + std::to_string(c.sequence) + " reached by " +
                              std::to_string(with.size()) + " of " +
                              std::to_string(c.members.size()) + " members");
        }
        continue;
      }
      with.push_back({r, i});
      if (c.send_to >= 0) {
        const auto it = recvs.find({c.group, static_cast<int>(r), c.send_to, c.send_sequence});
        if (it == recvs.end()) {
          throw unmatched(r, i, "send to " + std::to_string(c.send_to) + " never received");
        }
        with.push_back(it->second);
      }
      if (c.recv_from >= 0) {
        const auto it = sends.find({c.group, c.recv_from, static_cast<int>(r), c.recv_sequence});
        if (it == sends.end()) {
          throw unmatched(r, i, "recv from " + std::to_string(c.recv_from) + " never sent");
        }
        with.push_back(it->second);
      }
    }
  }
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> arrival(P);
  std::vector<size_t> next(P, 0);
  std::vector<double> clock(P, 0.0);
  std::vector<ReplayedRank> out(P);
  for (size_t r = 0; r < P; ++r) {
    arrival[r].assign(ranks[r].calls.size(), unknown);
  }
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < P; ++r) {
      while (next[r] < ranks[r].calls.size()) {
        const size_t i = next[r];
        const TimelineCall& c = ranks[r].calls[i];
        if (std::isnan(arrival[r][i])) {
          out[r].compute_s += c.compute_before_s;
          arrival[r][i] = clock[r] + c.compute_before_s;
          progress = true;
        }
        double start = arrival[r][i], last_wall_start = c.wall_start_s;
        bool ready = true;
        for (const Ref& other : partners[r][i]) {
          const double a = arrival[other.rank][other.call];
          if (std::isnan(a)) {
            ready = false;
            break;
          }
          start = std::max(start, a);
          last_wall_start =
              std::max(last_wall_start, ranks[other.rank].calls[other.call].wall_start_s);
        }
        if (!ready) {
          break;
        }
        const double transfer = std::max(0.0, c.wall_end_s - last_wall_start);
        out[r].wait_s += start - arrival[r][i];
        out[r].transfer_s += transfer;
        out[r].call_comm_s.push_back(start + transfer - arrival[r][i]);
        clock[r] = start + transfer;
        ++next[r];
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < P; ++r) {
    if (next[r] < ranks[r].calls.size()) {
      throw unmatched(r, next[r], "its partners never reach it (a cycle of blocking calls)");
    }
    out[r].compute_s += ranks[r].compute_after_s;
    out[r].end_s = clock[r] + ranks[r].compute_after_s;
  }
  return out;
}

namespace {

// Ctrl-C on any rank (the process flag its SIGINT handler sets) stops every
// rank at the same point: the ranks agree on it in one all-reduce, so none
// waits forever in a collective the others left.
void stop_together_if_interrupted(Communicator& world) {
  double stop = interrupt_requested() ? 1.0 : 0.0;
  world.all_reduce(make_view(&stop, ScalarType::fp64, DeviceKind::cpu, {1}), ReduceOp::max);
  if (stop != 0.0) {
    throw Interrupted("interrupted (Ctrl-C) during the parallel validation");
  }
}

}  // namespace

// ---- cases ---------------------------------------------------------------------------

std::vector<ParallelValidationCase> parallel_validation_cases(int world, bool quick) {
  if (world != 2 && world != 4) {
    throw ConfigError("parallel validation: " + std::to_string(world) +
                      " ranks; allowed: 2 or 4 ranks (the multi-process cases are defined for "
                      "them; mpirun -np 2 or -np 4)");
  }
  std::vector<ParallelValidationCase> cases;
  const std::vector<std::string> models =
      quick ? std::vector<std::string>{"dense"} : std::vector<std::string>{"dense", "moddar"};
  const auto add = [&](const std::string& name, const std::string& model,
                       const std::string& trainer, int64_t t, bool sp, int64_t p, int64_t zero,
                       int64_t microbatches) {
    ParallelValidationCase c;
    c.name = name + "-" + model;
    c.model = model;
    c.trainer = trainer;
    c.microbatches = microbatches;
    c.config = parallel_model(model);
    c.config.parallel.tensor = t;
    c.config.parallel.sequence_parallel = sp;
    c.config.parallel.pipeline = p;
    c.config.parallel.zero = zero;
    // The runtime's collectives block (no overlap with compute) and its
    // pipeline stages are cut by layer count.
    c.config.parallel.overlap_grad_reduce = false;
    c.config.parallel.overlap_param_gather = false;
    c.config.parallel.balance_stages = false;
    c.config.device.count = world;
    const int64_t dp = world / (t * p);
    c.config.train.global_batch = kGlobalBatch;
    c.config.train.micro_batch = kGlobalBatch / dp / microbatches;
    validate(c.config);
    cases.push_back(std::move(c));
  };
  const std::string w = std::to_string(world);
  for (const std::string& model : models) {
    add("dp" + w + "-zero0", model, "data", 1, false, 1, 0, 1);
  }
  add("dp" + w + "-zero1", "dense", "data", 1, false, 1, 1, 1);
  add("dp" + w + "-zero2", "dense", "data", 1, false, 1, 2, 1);
  for (const std::string& model : models) {
    add("tp" + w + "-sp", model, "tensor", world, true, 1, 0, 1);
  }
  // Pipeline: plain-residual models only, so the MoD model stands in for
  // MoD + DAR.
  for (const std::string& model :
       quick ? std::vector<std::string>{"dense"} : std::vector<std::string>{"dense", "mod"}) {
    add("pp" + w + "-1f1b-m4", model, "pipeline", 1, false, world, 0, 4);
  }
  if (world == 4) {
    for (const std::string& model : models) {
      add("tp2-sp-x-dp2-zero1", model, "tensor", 2, true, 1, 1, 1);
    }
    add("pp2-1f1b-m2-x-dp2-zero1", "dense", "pipeline", 1, false, 2, 1, 2);
  }
  return cases;
}

// ---- the run -------------------------------------------------------------------------

namespace {

struct LiveCase {
  ParallelValidationCase validation_case;
  ProcessGroups groups;
  std::unique_ptr<Model> model;
  std::unique_ptr<DataParallelTrainer> data;
  std::unique_ptr<ParallelTrainer> composed;  // tensor and / or pipeline
  Buffer tokens, targets;
  std::vector<std::vector<RankRound>> rounds;  // [round][rank]

  StepResult step() {
    if (data) {
      return data->train_step(tokens, targets);
    }
    return composed->train_step(tokens, targets);
  }
};

std::vector<int32_t> case_ids(int64_t vocab, int64_t seq, int64_t begin, int64_t rows, int shift,
                              uint64_t seed) {
  std::vector<int32_t> values;
  for (int64_t r = begin; r < begin + rows; ++r) {
    for (int64_t t = 0; t < seq; ++t) {
      const auto i = static_cast<uint64_t>(r * seq + t + shift) + 977 * seed;
      values.push_back(
          static_cast<int32_t>((i * 7919 + 13 + (i * i) % 5) % static_cast<uint64_t>(vocab)));
    }
  }
  return values;
}

double error_of(double predicted, double measured) {
  return measured > 0.0 ? (predicted - measured) / measured : 0.0;
}

double median(std::vector<double> values) {
  if (values.empty()) {
    return 0.0;
  }
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

}  // namespace

namespace {

// The cases to run: all of this world size's, or those named in options.only.
std::vector<ParallelValidationCase> chosen_cases(int world_size,
                                                 const ParallelValidationOptions& options) {
  std::vector<ParallelValidationCase> cases = parallel_validation_cases(world_size, options.quick);
  if (options.only.empty()) {
    return cases;
  }
  std::vector<ParallelValidationCase> chosen;
  for (const std::string& name : options.only) {
    const auto it = std::find_if(cases.begin(), cases.end(),
                                 [&](const ParallelValidationCase& c) { return c.name == name; });
    if (it == cases.end()) {
      std::string allowed;
      for (const auto& c : cases) {
        allowed += (allowed.empty() ? "" : ", ") + c.name;
      }
      throw ConfigError("cases: '" + name + "' is not a case on " + std::to_string(world_size) +
                        " ranks" + (options.quick ? " with quick" : "") + "; allowed: " + allowed);
    }
    chosen.push_back(*it);
  }
  return chosen;
}

// Case i's trainer over the timed world's process groups, its rank's rows of
// the global batch, warmed up.
std::unique_ptr<LiveCase> build_live_case(Backend& backend, TimingCommunicator& timed,
                                          const ParallelValidationCase& validation_case, size_t i,
                                          const ParallelValidationOptions& options) {
  auto lc = std::make_unique<LiveCase>();
  lc->validation_case = validation_case;
  const Config& config = validation_case.config;
  Config model_config = config;
  model_config.parallel = ParallelConfig{};
  model_config.device.count = 1;
  model_config.train.global_batch = 0;
  ModelOptions model_options;
  model_options.dtype = ScalarType::fp32;
  model_options.seed = options.seed + i;
  lc->groups = make_process_groups(timed, config.parallel);
  const int64_t dp = lc->groups.shape.data;
  const int64_t rows = kGlobalBatch / dp, seq = config.model.seq_len;
  const int64_t vocab = config.model.vocab_size;
  const Context ctx{backend, nullptr, ScalarType::fp32};
  const int64_t first_row = lc->groups.at.data * rows;
  lc->tokens = ctx.indices({rows, seq}, case_ids(vocab, seq, first_row, rows, 0, options.seed));
  lc->targets = ctx.indices({rows, seq}, case_ids(vocab, seq, first_row, rows, 1, options.seed));
  if (validation_case.trainer == "data") {
    lc->model = std::make_unique<Model>(backend, model_config, model_options);
    lc->data =
        std::make_unique<DataParallelTrainer>(*lc->model, *lc->groups.data, config.parallel.zero);
  } else {  // "tensor" or "pipeline": the composed trainer
    ParallelTrainerOptions composed;
    composed.microbatches =
        validation_case.trainer == "pipeline" ? validation_case.microbatches : 1;
    composed.sequence_parallel = config.parallel.sequence_parallel;
    composed.zero_stage = config.parallel.zero;
    lc->composed = std::make_unique<ParallelTrainer>(backend, model_config, model_options,
                                                     lc->groups, composed);
  }
  for (int w = 0; w < options.warmup_steps; ++w) {
    lc->step();
  }
  return lc;
}

// The busiest rank's communication of one replayed round, by the process
// group its calls ran in (classified by which layout coordinate the members
// vary in), plus any idle time after its last call.
std::vector<std::pair<std::string, double>> comm_by_group(
    const ParallelValidationCase& validation_case, int world_size,
    const RankTimeline& critical_timeline, const ReplayedRank& critical_replay, size_t critical,
    double step_s) {
  const LayoutShape shape = layout_shape(validation_case.config.parallel, world_size);
  std::map<std::string, double> by_group;
  for (size_t i = 0; i < critical_timeline.calls.size(); ++i) {
    const TimelineCall& call = critical_timeline.calls[i];
    std::vector<int> members = call.members;
    if (!call.collective) {
      members = {static_cast<int>(critical)};
      for (const int peer : {call.send_to, call.recv_from}) {
        if (peer >= 0) {
          members.push_back(peer);
        }
      }
    }
    bool tensor = false, stage = false, data = false;
    const LayoutCoordinates first = layout_coordinates(shape, members.front());
    for (const int m : members) {
      const LayoutCoordinates at = layout_coordinates(shape, m);
      tensor = tensor || at.tensor != first.tensor;
      stage = stage || at.stage != first.stage;
      data = data || at.data != first.data;
    }
    const int varying = (tensor ? 1 : 0) + (stage ? 1 : 0) + (data ? 1 : 0);
    const std::string label = members.size() == 1 ? "self"
                              : varying != 1      ? "world"
                              : tensor            ? "tensor"
                              : stage             ? "pipeline"
                                                  : "data";
    by_group[label] += critical_replay.call_comm_s[i];
  }
  if (step_s > critical_replay.end_s) {
    by_group["idle at the end"] += step_s - critical_replay.end_s;
  }
  return {by_group.begin(), by_group.end()};
}

// The measured side of a case: every round replayed, the median round's
// step, compute, transfer, wait and comm by group of its busiest rank.
ParallelCaseResult measured_case(const LiveCase& lc, int world_size) {
  ParallelCaseResult r;
  r.validation_case = lc.validation_case;
  r.rounds = static_cast<int64_t>(lc.rounds.size());
  // Replay every round; keep the median one.
  std::vector<std::vector<ReplayedRank>> replays;
  std::vector<double> steps, wall_steps, wall_comms;
  for (const auto& round : lc.rounds) {
    std::vector<RankTimeline> timelines;
    for (const RankRound& rr : round) {
      timelines.push_back(rr.timeline);
    }
    replays.push_back(replay_timeline(timelines));
    double end = 0.0, wall = 0.0, wall_comm = 0.0;
    for (int k = 0; k < world_size; ++k) {
      end = std::max(end, replays.back()[static_cast<size_t>(k)].end_s);
      if (round[static_cast<size_t>(k)].wall_step_s > wall) {
        wall = round[static_cast<size_t>(k)].wall_step_s;
        wall_comm = round[static_cast<size_t>(k)].wall_in_calls_s;
      }
    }
    steps.push_back(end);
    wall_steps.push_back(wall);
    wall_comms.push_back(wall_comm);
  }
  const double median_step = median(steps);
  const auto median_round =
      static_cast<size_t>(std::find(steps.begin(), steps.end(), median_step) - steps.begin());
  const std::vector<ReplayedRank>& chosen = replays[median_round];
  size_t critical = 0;  // the busiest rank
  double step = 0.0;
  for (size_t k = 0; k < chosen.size(); ++k) {
    r.rank_compute_s.push_back(chosen[k].compute_s);
    r.rank_comm_s.push_back(chosen[k].transfer_s + chosen[k].wait_s);
    r.rank_end_s.push_back(chosen[k].end_s);
    step = std::max(step, chosen[k].end_s);
    if (chosen[k].compute_s > chosen[critical].compute_s) {
      critical = k;
    }
  }
  r.step_s = step;
  r.busiest_rank = static_cast<int>(critical);
  r.compute_s = chosen[critical].compute_s;
  r.transfer_s = chosen[critical].transfer_s;
  r.comm_s = r.step_s - r.compute_s;
  r.wait_s = r.comm_s - r.transfer_s;
  const RankTimeline& critical_timeline = lc.rounds[median_round][critical].timeline;
  r.calls_per_step = static_cast<int64_t>(critical_timeline.calls.size());
  r.comm_by_group_s = comm_by_group(lc.validation_case, world_size, critical_timeline,
                                    chosen[critical], critical, step);
  r.step_spread = summarize_samples(steps).spread();
  r.wall_step_s = median(wall_steps);
  r.wall_comm_s = median(wall_comms);
  for (const RankRound& rr : lc.rounds.back()) {
    r.rank_peak_bytes.push_back(rr.peak_bytes);
  }
  r.peak_bytes = *std::max_element(r.rank_peak_bytes.begin(), r.rank_peak_bytes.end());
  return r;
}

// The predicted side of a case (the planner's cluster estimate) and the errors.
void predict_case(ParallelCaseResult& r, const DeviceProfile& profile, int world_size) {
  const Config& config = r.validation_case.config;
  const Estimate estimate_result = estimate(config, profile, StepKind::train);
  if (!estimate_result.cluster) {
    throw std::logic_error("parallel validation: the planner did not engage its cluster model");
  }
  const ClusterEstimate& cluster = *estimate_result.cluster;
  r.predicted_step_s = estimate_result.time.step_s;
  // The per-step work outside the micro-batches (optimizer, gradient norm,
  // host time per step) is counted with the compute: the parts add to the step.
  r.predicted_compute_s =
      cluster.compute_s + cluster.optimizer_s + cluster.grad_norm_s + cluster.step_overhead_s;
  r.predicted_bubble_s = cluster.bubble_s;
  r.predicted_comm_s = cluster.exposed_comm_s + cluster.bubble_s;
  std::map<std::string, double> by_group;
  for (const CommRecord& record : cluster.comm) {
    by_group[record.group] += record.count * record.time_s * record.exposed_fraction;
  }
  if (cluster.bubble_s > 0.0) {
    by_group["pipeline bubble"] += cluster.bubble_s;
  }
  r.predicted_comm_by_group_s.assign(by_group.begin(), by_group.end());
  const LayoutShape shape = layout_shape(config.parallel, world_size);
  for (int k = 0; k < world_size; ++k) {
    const int64_t stage = layout_coordinates(shape, k).stage;
    r.rank_predicted_peak_bytes.push_back(cluster.stages[static_cast<size_t>(stage)].memory.peak);
  }
  r.predicted_peak_bytes = estimate_result.memory.peak;
  r.step_error = error_of(r.predicted_step_s, r.step_s);
  r.compute_error = error_of(r.predicted_compute_s, r.compute_s);
  r.comm_error = error_of(r.predicted_comm_s, r.comm_s);
  r.memory_error = error_of(r.predicted_peak_bytes, r.peak_bytes);
}

// The medians and maxima over the cases.
void summarize_parallel_report(ParallelValidationReport& report) {
  std::vector<double> step_errors, compute_errors, comm_errors, memory_errors;
  for (const ParallelCaseResult& r : report.cases) {
    step_errors.push_back(std::abs(r.step_error));
    compute_errors.push_back(std::abs(r.compute_error));
    comm_errors.push_back(std::abs(r.comm_error));
    memory_errors.push_back(std::abs(r.memory_error));
  }
  const auto true_median = [](std::vector<double> v) {
    return v.empty() ? 0.0 : summarize_samples(std::move(v)).median_s;
  };
  const auto max_of = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  report.step_median_abs_error = true_median(step_errors);
  report.step_max_abs_error = max_of(step_errors);
  report.compute_median_abs_error = true_median(compute_errors);
  report.comm_median_abs_error = true_median(comm_errors);
  report.memory_median_abs_error = true_median(memory_errors);
  report.memory_max_abs_error = max_of(memory_errors);
}

std::string parallel_method_text(int world_size, int logical_cpus,
                                 const ParallelValidationOptions& options) {
  std::ostringstream method;
  method << world_size << " ranks (" << logical_cpus
         << " logical CPUs), one thread each; every case built and warmed up ("
         << options.warmup_steps << " steps), then " << options.rounds
         << " interleaved rounds of one step per case after a world barrier. Every communicator "
            "call of the trainers goes through a timing decorator. compute = process CPU time "
            "outside communicator calls; transfer = wall time of a call from its last "
            "participant's arrival to its end; the step is replayed as if each rank had its own "
            "core (a call completes at the latest arrival of its participants + its transfer), "
            "wait = the replayed idle time in calls (imbalance, pipeline bubble); step = the "
            "slowest rank's replayed end; compute = the busiest rank's (largest compute), comm = "
            "step - compute = its transfer + wait; the round with the median step is reported. "
            "wall = the raw oversubscribed wall step (not compared). "
            "predicted = estimate() with the case's [parallel] layout (no overlap, stages by layer "
            "count): compute = compute_s + optimizer_s, comm = exposed_comm_s + bubble_s";
  return method.str();
}

}  // namespace

ParallelValidationReport run_parallel_validation(Backend& backend, Communicator& world,
                                                 const DeviceProfile& profile,
                                                 const ParallelValidationOptions& options) {
  if (backend.device() != DeviceKind::cpu) {
    throw ConfigError("parallel validation: backend = " + backend.name() +
                      ": only the cpu backend (compute is timed by process CPU time)");
  }
  if (world.size() > kMaxWorld) {
    throw ConfigError("parallel validation: " + std::to_string(world.size()) + " ranks: at most " +
                      std::to_string(kMaxWorld));
  }
  // Compute is compared in process CPU time: a profile timed by the wall
  // clock holds other times (every rank checks it before communicating).
  const auto clock = profile.provenance.find("clock");
  if (clock != profile.provenance.end() && clock->second != "cpu") {
    throw ConfigError(profile.name + ": provenance.clock = \"" + clock->second +
                      "\": the parallel validation compares CPU-time compute; allowed: a "
                      "profile measured with the cpu clock");
  }
  const std::vector<ParallelValidationCase> cases = chosen_cases(world.size(), options);
  set_cpu_threads(1);  // one thread per rank: its process CPU time is its work
  const bool lead = world.rank() == 0;
  std::FILE* progress = lead ? options.progress : nullptr;

  auto recorder = std::make_shared<Recorder>(world.rank());
  std::vector<int> identity(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) {
    identity[static_cast<size_t>(r)] = r;
  }
  std::unique_ptr<Communicator> inner_world = world.split(0, world.rank());
  TimingCommunicator timed(std::move(inner_world), recorder, identity);

  ParallelValidationReport report;
  report.profile_name = profile.name;
  report.engine = world.engine();
  report.world = world.size();
  report.logical_cpus = read_host_facts().logical_cpus;
  report.load_average_before = load_average();
  const auto provenance = [&](const char* key) {
    const auto it = profile.provenance.find(key);
    return it == profile.provenance.end() ? std::string("(not recorded)") : it->second;
  };
  report.network = "[network] of " + profile.name + ": " + provenance("network_engine") + ", " +
                   provenance("network_ranks") + " ranks, measured " + provenance("network_date") +
                   " at load " + provenance("network_load_average");

  std::vector<std::unique_ptr<LiveCase>> live;
  for (size_t i = 0; i < cases.size(); ++i) {
    live.push_back(build_live_case(backend, timed, cases[i], i, options));
    stop_together_if_interrupted(world);
    if (progress != nullptr) {
      std::fprintf(progress, "modar validate --parallel: built %s (%zu/%zu)\n",
                   cases[i].name.c_str(), i + 1, cases.size());
    }
  }

  // Interleaved rounds: a world barrier (untimed), one recorded step, the
  // records gathered (untimed).
  for (int round = 0; round < options.rounds; ++round) {
    const double round_start = steady_now_s();
    for (auto& lc : live) {
      timed.inner().barrier();
      recorder->start();
      const StepResult step = lc->step();
      recorder->stop();
      lc->rounds.push_back(
          gather_round(timed.inner(), recorder->serialize(static_cast<double>(step.peak_bytes))));
    }
    if (progress != nullptr) {
      std::fprintf(progress, "modar validate --parallel: round %d/%d (%.1f s wall)\n", round + 1,
                   options.rounds, steady_now_s() - round_start);
    }
    stop_together_if_interrupted(timed.inner());
  }
  report.load_average_after = load_average();

  for (const auto& lc : live) {
    ParallelCaseResult r = measured_case(*lc, world.size());
    predict_case(r, profile, world.size());
    report.cases.push_back(std::move(r));
  }
  summarize_parallel_report(report);
  report.method = parallel_method_text(world.size(), report.logical_cpus, options);
  live.clear();  // trainers hold the groups' communicators: before `timed`
  return report;
}

// ---- output --------------------------------------------------------------------------

std::string parallel_validation_text(const ParallelValidationReport& report) {
  std::ostringstream out;
  char line[640];
  out << "modar validate --parallel: profile " << report.profile_name << ", " << report.world
      << " ranks on " << report.logical_cpus << " logical CPUs, " << report.engine << "\n"
      << report.network << "\n\n";
  std::snprintf(line, sizeof(line),
                "%-30s %9s %9s %7s | %9s %9s %7s | %9s %9s %9s %7s | %8s %8s %7s | %9s\n", "case",
                "step", "pred", "error", "compute", "pred", "error", "comm", "(wait)", "pred",
                "error", "peak MiB", "pred", "error", "wall");
  out << line;
  for (const ParallelCaseResult& r : report.cases) {
    std::snprintf(line, sizeof(line),
                  "%-30s %7.1fms %7.1fms %+6.1f%% | %7.1fms %7.1fms %+6.1f%% | %7.1fms %7.1fms "
                  "%7.1fms %+6.1f%% | %8.2f %8.2f %+6.1f%% | %7.1fms\n",
                  r.validation_case.name.c_str(), 1e3 * r.step_s, 1e3 * r.predicted_step_s,
                  100.0 * r.step_error, 1e3 * r.compute_s, 1e3 * r.predicted_compute_s,
                  100.0 * r.compute_error, 1e3 * r.comm_s, 1e3 * r.wait_s, 1e3 * r.predicted_comm_s,
                  100.0 * r.comm_error, r.peak_bytes / 1048576.0,
                  r.predicted_peak_bytes / 1048576.0, 100.0 * r.memory_error, 1e3 * r.wall_step_s);
    out << line;
  }
  out << "\ncommunication by group, ms (measured: the busiest rank's transfer + wait; predicted: "
         "the planner's comm records x exposed share, and the bubble):\n";
  for (const ParallelCaseResult& r : report.cases) {
    std::snprintf(line, sizeof(line), "%-30s measured", r.validation_case.name.c_str());
    out << line;
    for (const auto& [group, seconds] : r.comm_by_group_s) {
      std::snprintf(line, sizeof(line), " %s %.1f", group.c_str(), 1e3 * seconds);
      out << line;
    }
    out << "; predicted";
    for (const auto& [group, seconds] : r.predicted_comm_by_group_s) {
      std::snprintf(line, sizeof(line), " %s %.1f", group.c_str(), 1e3 * seconds);
      out << line;
    }
    out << "\n";
  }
  std::snprintf(line, sizeof(line),
                "\nstep time   |error|: median %.1f%%, max %.1f%%\n"
                "compute     |error|: median %.1f%%\n"
                "comm        |error|: median %.1f%%\n"
                "peak memory |error|: median %.1f%%, max %.1f%% (the busiest rank)\n",
                100.0 * report.step_median_abs_error, 100.0 * report.step_max_abs_error,
                100.0 * report.compute_median_abs_error, 100.0 * report.comm_median_abs_error,
                100.0 * report.memory_median_abs_error, 100.0 * report.memory_max_abs_error);
  out << line;
  out << "step = the slowest rank's replayed end; compute = the busiest rank's CPU time; comm = "
         "step - compute = its transfer + wait; pred comm includes the pipeline bubble; wall = "
         "raw oversubscribed wall step (slowest rank, median)\n";
  out << "load average before / after: " << report.load_average_before << " / "
      << report.load_average_after << "\n";
  out << "method: " << report.method << "\n";
  return out.str();
}

std::string parallel_validation_json(const ParallelValidationReport& report) {
  JsonWriter json;
  json.begin_object();
  json.field("profile", report.profile_name);
  json.field("engine", report.engine);
  json.field("ranks", static_cast<int64_t>(report.world));
  json.field("logical_cpus", static_cast<int64_t>(report.logical_cpus));
  json.field("network", report.network);
  // Seconds by process group ("tensor", "data", ...) as one object.
  const auto by_group = [&](const char* key,
                            const std::vector<std::pair<std::string, double>>& seconds) {
    json.key(key).begin_object();
    for (const auto& [group, s] : seconds) {
      json.field(group, s);
    }
    json.end_object();
  };
  json.key("cases").begin_array();
  for (const ParallelCaseResult& r : report.cases) {
    const Config& c = r.validation_case.config;
    json.begin_object();
    json.field("name", r.validation_case.name);
    json.field("model", r.validation_case.model);
    json.field("trainer", r.validation_case.trainer);
    json.key("layout").begin_object();
    json.field("tensor", c.parallel.tensor)
        .field("sequence_parallel", c.parallel.sequence_parallel);
    json.field("pipeline", c.parallel.pipeline).field("zero", c.parallel.zero);
    json.field("data", c.parallel.data(c.device.count));
    json.field("microbatches", r.validation_case.microbatches);
    json.field("micro_batch", c.train.micro_batch).field("global_batch", c.train.global_batch);
    json.end_object();
    json.key("measured").begin_object();
    json.field("step_s", r.step_s).field("compute_s", r.compute_s).field("comm_s", r.comm_s);
    json.field("transfer_s", r.transfer_s).field("wait_s", r.wait_s);
    json.field("busiest_rank", static_cast<int64_t>(r.busiest_rank));
    json.field("step_spread", r.step_spread).field("rounds", r.rounds);
    json.field("calls_per_step", r.calls_per_step);
    json.field("wall_step_s", r.wall_step_s).field("wall_comm_s", r.wall_comm_s);
    by_group("comm_by_group_s", r.comm_by_group_s);
    json.field("rank_compute_s", r.rank_compute_s);
    json.field("rank_comm_s", r.rank_comm_s);
    json.field("rank_end_s", r.rank_end_s);
    json.field("rank_peak_bytes", r.rank_peak_bytes);
    json.end_object();
    json.key("predicted").begin_object();
    json.field("step_s", r.predicted_step_s).field("compute_s", r.predicted_compute_s);
    json.field("comm_s", r.predicted_comm_s).field("bubble_s", r.predicted_bubble_s);
    by_group("comm_by_group_s", r.predicted_comm_by_group_s);
    json.field("rank_peak_bytes", r.rank_predicted_peak_bytes);
    json.end_object();
    json.key("error").begin_object();
    json.field("step", r.step_error).field("compute", r.compute_error).field("comm", r.comm_error);
    json.field("memory", r.memory_error);
    json.end_object();
    json.end_object();
  }
  json.end_array();
  validate_detail::write_abs_errors_json(json, "step_time", report.step_median_abs_error,
                                         report.step_max_abs_error, [] {});
  json.field("compute_median_abs_error", report.compute_median_abs_error);
  json.field("comm_median_abs_error", report.comm_median_abs_error);
  validate_detail::write_memory_and_load_json(json, report);
  json.field("method", report.method);
  json.end_object();
  return json.str() + "\n";
}

}  // namespace modar::runtime
