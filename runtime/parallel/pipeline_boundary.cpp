// runtime/parallel/pipeline_boundary.cpp: what crosses a pipeline boundary
// (pipeline_internal.hpp, ParallelTrainer::Boundary).
//
// Plain residual: the chunk's output [mb, s, d] forward, its gradient back.
//
// AttnRes / DAR (docs/runtime_parallel.md): there is no residual stream to
// send; a boundary carries the history bank (entries with their key rstd,
// and a cut block's partial P as one more entry), and the backward returns
// the gradient of the same entries.  With parallel.dar_bank_cache a stage
// keeps the bank of a micro-batch across its chunks (virtual stages), the
// boundary sends only the entries it did not hold, and the gradient of a
// cached entry stays in the stage's bank gradient: it goes back with the
// boundary that first brought the entry (its chunks run backward in reverse,
// so every later use has added into it by then).  Each stage zeroes the
// gradient it sends back, so no entry's gradient is counted twice.
//
// Tensor parallelism without SP: every tensor rank holds the same boundary
// tensors; rank r sends the r-th of t equal pieces of each (flattened) and
// the receiver all-gathers them, so a boundary costs 1 / t of the tensor per
// rank on the pipeline link (the planner's b s d B / t).  A tensor whose
// size t does not divide goes whole.
#include "pipeline_internal.hpp"

namespace modar::runtime {

bool ParallelTrainer::Boundary::split_over_tensor(const TensorView& buf) const {
  const int64_t t = trainer_.groups_.tensor->size();
  return t > 1 && !trainer_.sequence_parallel() && buf.numel() % t == 0;
}

void ParallelTrainer::Boundary::send(const TensorView& buf, int peer) {
  Communicator& pipe = *trainer_.groups_.pipeline;
  if (!split_over_tensor(buf)) {
    pipe.send(buf, peer);
    return;
  }
  Communicator& tensor = *trainer_.groups_.tensor;
  const int64_t piece = buf.numel() / tensor.size();
  pipe.send(slice(reshape(buf, {buf.numel()}), tensor.rank() * piece, piece), peer);
}

void ParallelTrainer::Boundary::recv(const TensorView& buf, int peer) {
  Communicator& pipe = *trainer_.groups_.pipeline;
  if (!split_over_tensor(buf)) {
    pipe.recv(buf, peer);
    return;
  }
  Communicator& tensor = *trainer_.groups_.tensor;
  Buffer piece = trainer_.context().make({buf.numel() / tensor.size()}, buf.dtype);
  pipe.recv(piece, peer);
  tensor.all_gather(piece, reshape(buf, {buf.numel()}));
}

int64_t ParallelTrainer::Boundary::rows(const Micro& micro) const {
  const int64_t seq = micro.tokens.dim(1);
  const int64_t t = trainer_.sequence_parallel() ? trainer_.groups_.tensor->size() : 1;
  return micro.tokens.dim(0) * seq / t;
}

int64_t ParallelTrainer::Boundary::chunk_end_layer(int64_t c) const {
  return chunk_first_layer(trainer_.config_.model.n_layers, trainer_.chunk_count_, c + 1);
}

int64_t ParallelTrainer::Boundary::bank_held_before(int64_t c) const {
  // The receiver of chunk c held its chunk c - p's bank: every complete entry
  // up to that chunk's end (its partial, if cut, has changed since).
  const int64_t p = trainer_.stages_;
  if (!trainer_.parallel_.dar_bank_cache || c - p < 0) {
    return 0;
  }
  return trainer_.depth_->complete_entries(2 * chunk_end_layer(c - p));
}

ParallelTrainer::Boundary::BankSpan ParallelTrainer::Boundary::bank_span(int64_t c) const {
  const DepthResidual& depth = *trainer_.depth_;
  BankSpan span;
  span.end_branch = 2 * chunk_end_layer(c);
  span.from = bank_held_before(c + 1);
  span.entries = depth.complete_entries(span.end_branch) - span.from +
                 (depth.cuts_block(span.end_branch) ? 1 : 0);
  return span;
}

void ParallelTrainer::Boundary::send_forward(Micro& mu, const Chunk& chunk) {
  const int peer = owner(chunk.index + 1);
  if (!trainer_.depth_) {
    send(mu.x, peer);
    mu.x.reset();  // the stage output goes on and is no longer needed here
    return;
  }
  const BankSpan span = bank_span(chunk.index);
  if (span.entries > 0) {
    DepthScope scope(trainer_.depth_.get(), mu.depth);
    const DepthResidual::BoundaryBuffers out =
        trainer_.depth_->pack_boundary(trainer_.context(), span.end_branch, span.from);
    send(out.values, peer);
    send(out.stats, peer);
  }
}

void ParallelTrainer::Boundary::recv_forward(Micro& mu, const Chunk& chunk) {
  const Context ctx = trainer_.context();
  const int peer = owner(chunk.index - 1);
  const int64_t d = trainer_.config_.model.d_model;
  if (!trainer_.depth_) {
    mu.x = ctx.make({mu.tokens.dim(0), rows(mu) / mu.tokens.dim(0), d});
    recv(mu.x, peer);
    return;
  }
  DepthResidual& depth = *trainer_.depth_;
  const BankSpan span = bank_span(chunk.index - 1);
  DepthScope scope(&depth, mu.depth);
  depth.begin_received(ctx, rows(mu));
  if (span.entries > 0) {
    const int64_t n = depth.options().streams;
    DepthResidual::BoundaryBuffers in;
    in.values = ctx.make({n, span.entries, rows(mu), d});
    in.stats = ctx.make({n, span.entries, rows(mu)}, ctx.stats());
    recv(in.values, peer);
    recv(in.stats, peer);
    depth.unpack_boundary(ctx, span.end_branch, span.from, in);
  }
}

void ParallelTrainer::Boundary::send_backward(Micro& mu, const Chunk& chunk) {
  const int peer = owner(chunk.index - 1);
  if (!trainer_.depth_) {
    send(mu.dx, peer);
    mu.dx.reset();
    return;
  }
  DepthResidual& depth = *trainer_.depth_;
  const BankSpan span = bank_span(chunk.index - 1);
  DepthScope scope(&depth, mu.depth);
  if (span.entries > 0) {
    const Buffer dvalues =
        depth.pack_boundary_gradient(trainer_.context(), span.end_branch, span.from);
    send(dvalues, peer);
  }
  if (&chunk == &trainer_.chunks_.front()) {
    // This micro-batch is done here: the depth queries' gradients.
    depth.finish_backward(trainer_.context(), TensorView{});
  }
}

void ParallelTrainer::Boundary::recv_backward(Micro& mu, const Chunk& chunk) {
  const Context ctx = trainer_.context();
  const int peer = owner(chunk.index + 1);
  const int64_t d = trainer_.config_.model.d_model;
  if (!trainer_.depth_) {
    mu.dx = ctx.make({mu.tokens.dim(0), rows(mu) / mu.tokens.dim(0), d});
    recv(mu.dx, peer);
    return;
  }
  DepthResidual& depth = *trainer_.depth_;
  const BankSpan span = bank_span(chunk.index);
  DepthScope scope(&depth, mu.depth);
  depth.begin_backward_received(ctx);
  if (span.entries > 0) {
    Buffer dvalues = ctx.make({depth.options().streams, span.entries, rows(mu), d});
    recv(dvalues, peer);
    depth.unpack_boundary_gradient(ctx, span.end_branch, span.from, dvalues);
  }
}

}  // namespace modar::runtime
