// Collective kernels: validate, describe each tensor to the engine and
// complete asynchronously when the engine is done. No communication happens
// here. Each class serves the CPU and, in a build with GOOGLE_CUDA, the GPU
// (registrations at the end): a GPU kernel only adds the device and stream its
// tensors live on (tf_device.h), and keeps its outputs out of the host-memory
// shared output arena.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/numbered_names.h"
#include "common/reducescatter_rows.h"
#include "engine.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf_device.h"
#include "tf_engine_bridge.h"

namespace smdist {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace bridge = tf_bridge;

// Completes the op once every entry it submitted is done, with the first
// error any of them reported.
class OpCompletion {
 public:
  OpCompletion(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done, int pending)
      : ctx_(ctx), done_(std::move(done)), pending_(pending) {}

  // Holds `input` until the op completes: the engine reads it asynchronously.
  // Only called while the op is being set up, before any entry can finish.
  void KeepAlive(const Tensor& input) { keep_alive_.push_back(input); }

  void EntryDone(const Status& s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_error_.ok()) first_error_ = s;
    }
    if (pending_.fetch_sub(1) == 1) {
      if (!first_error_.ok()) ctx_->SetStatus(bridge::ToTfStatus(first_error_));
      // Let go of the inputs before completing: done_() may start the next op
      // inline, and an extra reference to a buffer this op forwarded to its
      // output would stop that op from reducing in place.
      keep_alive_.clear();
      done_();
    }
  }

 private:
  OpKernelContext* ctx_;
  AsyncOpKernel::DoneCallback done_;
  std::vector<Tensor> keep_alive_;
  std::atomic<int> pending_;
  std::mutex mu_;
  Status first_error_;
};

// A tensor's memory in the engine's shared output arena: peers on this host
// store reduced shards straight into it. Frees the block when the last tensor
// referring to it goes.
class SharedOutputBuffer : public tensorflow::TensorBuffer {
 public:
  explicit SharedOutputBuffer(std::unique_ptr<SharedOutputBlock> block)
      : TensorBuffer(block->data()), block_(std::move(block)) {}
  size_t size() const override { return static_cast<size_t>(block_->bytes()); }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size()));
    proto->set_allocator_name("smdist_shared_output");
  }

 private:
  std::unique_ptr<SharedOutputBlock> block_;
};

// Smaller outputs stay with TensorFlow's allocator: they rarely take the
// cross-memory path, and would only fragment the arena.
constexpr int64_t kMinSharedOutputBytes = 64 * 1024;

// Output `index` shaped like input `index`: the input itself when TensorFlow
// lets us reduce in place (no second buffer to fill, and an input already in
// the arena stays there), else in the shared output arena when there is room
// (`host_memory`: the arena is host memory, so never for a GPU kernel), else
// allocated by TensorFlow. Eager inputs are never forwarded: Python holds them.
absl::Status AllocateAllreduceOutput(OpKernelContext* ctx, int index, bool host_memory, Tensor** out) {
  const Tensor& input = ctx->input(index);
  const int64_t bytes = static_cast<int64_t>(input.TotalBytes());
  if (ctx->forward_input_to_output_with_shape(index, index, input.shape(), out)) return absl::OkStatus();
  if (host_memory && bytes >= kMinSharedOutputBytes) {
    if (auto block = Engine::Instance().AllocateSharedOutput(bytes)) {
      // TensorFlow's buffers are reference counted and delete themselves; the
      // RefCountPtr owns the one reference `new` creates.
      tensorflow::core::RefCountPtr<tensorflow::TensorBuffer> buffer(new SharedOutputBuffer(std::move(block)));
      ctx->set_output(index, Tensor(input.dtype(), input.shape(), std::move(buffer)));
      *out = ctx->mutable_output(index);
      return absl::OkStatus();
    }
  }
  return ctx->allocate_output(index, input.shape(), out);
}

class CollectiveKernel : public AsyncOpKernel {
 public:
  explicit CollectiveKernel(OpKernelConstruction* c) : AsyncOpKernel(c), gpu_(bridge::IsGpuKernel(c)) {
    if (c->HasAttr("process_set_id")) OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }

 protected:
  // This rank's place in the op's process set; an error when the set is
  // unknown or this rank is not a member (the engine refuses those too).
  absl::Status Membership(ProcessSetMembership* set) const {
    return bridge::ToTfStatus(Engine::Instance().Membership(process_set_id_, set, /*require_member=*/true));
  }

  // Inputs that are tensors to exchange: all but the name, which comes last.
  static int DataInputs(OpKernelContext* ctx) { return ctx->num_inputs() - 1; }

  // The name of this call's collective: the op's last input, or the node's
  // name when that is empty; numbered for unnamed eager calls.
  absl::Status CallName(OpKernelContext* ctx, std::string* out) const {
    const Tensor& name = ctx->input(ctx->num_inputs() - 1);
    if (!tensorflow::TensorShapeUtils::IsScalar(name.shape())) {
      return absl::InvalidArgumentError("tensor_name must be a scalar string, got shape " +
                                        name.shape().DebugString());
    }
    const tensorflow::tstring& given = name.scalar<tensorflow::tstring>()();
    *out = given.empty() ? this->name() : std::string(given);
    if (IsNumberedPerCall(*out)) *out = NextNumberedName(*out, process_set_id_);
    return absl::OkStatus();
  }

  static std::string EntryName(const std::string& call_name, int index, int count) {
    return count == 1 ? call_name : call_name + "." + std::to_string(index);
  }

  // Fills the fields every entry shares from input `index`, the device included.
  absl::Status Describe(const std::string& call_name, OpKernelContext* ctx, int index, int count,
                        TensorEntry* e) {
    const Tensor& input = ctx->input(index);
    if (!bridge::ToEngineType(input.dtype(), &e->dtype)) {
      return absl::InvalidArgumentError("smdist_tf does not support dtype " +
                                        tensorflow::DataTypeString(input.dtype()));
    }
    e->name = EntryName(call_name, index, count);
    e->process_set_id = process_set_id_;
    e->shape = bridge::ToDims(input.shape());
    e->input = input.tensor_data().data();
    return bridge::PlaceOnDevice(gpu_, ctx, e);
  }

  // Hands `entries` to the engine; on refusal completes the op with the error.
  void Submit(OpKernelContext* ctx, std::vector<TensorEntry> entries,
              const std::shared_ptr<OpCompletion>& completion, DoneCallback done,
              bool run_inline = false) {
    Status s = Engine::Instance().Enqueue(std::move(entries), run_inline);
    if (!s.ok()) {
      ctx->SetStatus(bridge::ToTfStatus(s));
      done();
    }
  }

  static std::function<void(const Status&)> DoneFor(std::shared_ptr<OpCompletion> completion,
                                                   const Tensor& input) {
    completion->KeepAlive(input);
    return [completion](const Status& s) { completion->EntryDone(s); };
  }

  int process_set_id_ = 0;  // 0: all ranks
  // A kernel registered for DEVICE_GPU: its data tensors are in GPU memory.
  // Shapes, splits, names and Join's result stay on the host (HostMemory).
  const bool gpu_;
};

class AllreduceKernel : public CollectiveKernel {
 public:
  explicit AllreduceKernel(OpKernelConstruction* c) : CollectiveKernel(c) {
    int op = 0;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    OP_REQUIRES(c, IsValidReduceOp(op), absl::InvalidArgumentError("invalid reduce_op"));
    reduce_op_ = static_cast<ReduceOp>(op);
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    OP_REQUIRES_OK(c, c->GetAttr("run_inline", &run_inline_));
    std::string compression;
    OP_REQUIRES_OK(c, c->GetAttr("compression", &compression));
    OP_REQUIRES(c, WireCompressionFromName(compression, &compression_),
                absl::InvalidArgumentError("unknown compression " + compression));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = DataInputs(ctx);
    std::string call_name;
    OP_REQUIRES_OK_ASYNC(ctx, CallName(ctx, &call_name), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, n);
    std::vector<TensorEntry> entries(n);
    for (int i = 0; i < n; ++i) {
      TensorEntry& e = entries[i];
      OP_REQUIRES_OK_ASYNC(ctx, Describe(call_name, ctx, i, n, &e), done);
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, AllocateAllreduceOutput(ctx, i, /*host_memory=*/!gpu_, &out), done);
      e.output = const_cast<char*>(out->tensor_data().data());
      e.reduce_op = reduce_op_;
      e.prescale = prescale_;
      e.postscale = postscale_;
      e.compression = compression_;
      e.done = DoneFor(completion, ctx->input(i));
    }
    Submit(ctx, std::move(entries), completion, done, run_inline_);
  }

 private:
  bool run_inline_ = false;
  WireCompression compression_ = WireCompression::kNone;
  ReduceOp reduce_op_ = ReduceOp::kSum;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = DataInputs(ctx);
    std::string call_name;
    OP_REQUIRES_OK_ASYNC(ctx, CallName(ctx, &call_name), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, n);
    std::vector<TensorEntry> entries(n);
    for (int i = 0; i < n; ++i) {
      TensorEntry& e = entries[i];
      OP_REQUIRES_OK_ASYNC(ctx, Describe(call_name, ctx, i, n, &e), done);
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(
          ctx, ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &out), done);
      e.output = const_cast<char*>(out->tensor_data().data());
      e.type = CollectiveType::kBroadcast;
      e.root_rank = root_rank_;  // a world rank: the engine checks it against the set
      e.done = DoneFor(completion, ctx->input(i));
    }
    Submit(ctx, std::move(entries), completion, done);
  }

 private:
  int root_rank_ = 0;
};

class AllgatherKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::string call_name;
    OP_REQUIRES_OK_ASYNC(ctx, CallName(ctx, &call_name), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, 1);
    std::vector<TensorEntry> entries(1);
    TensorEntry& e = entries[0];
    OP_REQUIRES_OK_ASYNC(ctx, Describe(call_name, ctx, 0, 1, &e), done);
    e.type = CollectiveType::kAllgather;
    if (e.shape.empty()) {
      e.local_error = "allgather of '" + e.name + "' needs a tensor of rank >= 1, got a scalar";
    }
    e.allocate_output = [ctx](const std::vector<int64_t>& shape, void** data) {
      Tensor* out = nullptr;
      absl::Status s = ctx->allocate_output(0, bridge::ToShape(shape), &out);
      if (!s.ok()) return bridge::FromTfStatus(s);
      *data = const_cast<char*>(out->tensor_data().data());
      return Status::OK();
    };
    e.done = DoneFor(completion, ctx->input(0));
    Submit(ctx, std::move(entries), completion, done);
  }
};

class AlltoallKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ProcessSetMembership set;
    OP_REQUIRES_OK_ASYNC(ctx, Membership(&set), done);
    std::string call_name;
    OP_REQUIRES_OK_ASYNC(ctx, CallName(ctx, &call_name), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, 1);
    std::vector<TensorEntry> entries(1);
    TensorEntry& e = entries[0];
    OP_REQUIRES_OK_ASYNC(ctx, Describe(call_name, ctx, 0, 1, &e), done);
    e.type = CollectiveType::kAlltoall;
    e.local_error = ReadSplits(ctx->input(1), e.name, e.shape, static_cast<int>(set.ranks.size()), &e.splits);
    e.allocate_output = [ctx](const std::vector<int64_t>& shape, void** data) {
      Tensor* out = nullptr;
      absl::Status s = ctx->allocate_output(0, bridge::ToShape(shape), &out);
      if (!s.ok()) return bridge::FromTfStatus(s);
      *data = const_cast<char*>(out->tensor_data().data());
      return Status::OK();
    };
    e.set_received_splits = [ctx](const std::vector<int64_t>& received) {
      Tensor* out = nullptr;
      tensorflow::TensorShape shape({static_cast<int64_t>(received.size())});
      if (!ctx->allocate_output(1, shape, &out).ok()) return;
      auto flat = out->flat<int64_t>();
      for (size_t i = 0; i < received.size(); ++i) flat(i) = received[i];
    };
    e.done = DoneFor(completion, ctx->input(0));
    Submit(ctx, std::move(entries), completion, done);
  }

 private:
  // Returns "" when the splits are usable; empty splits mean equal parts.
  // `size`: the ranks of the op's process set.
  static std::string ReadSplits(const Tensor& splits_tensor, const std::string& name,
                                const std::vector<int64_t>& shape, int size, std::vector<int64_t>* splits) {
    const std::string what = "alltoall of '" + name + "': ";
    if (shape.empty()) return what + "needs a tensor of rank >= 1, got a scalar";
    const int64_t rows = shape[0];
    if (splits_tensor.NumElements() == 0) {
      if (rows % size != 0) {
        return what + "first dimension " + std::to_string(rows) +
               " does not divide evenly by " + std::to_string(size) +
               " ranks; pass splits explicitly";
      }
      splits->assign(size, rows / size);
      return "";
    }
    if (splits_tensor.dims() != 1 || splits_tensor.NumElements() != size) {
      return what + "splits must be a vector of " + std::to_string(size) +
             " elements (one per rank), got shape " + splits_tensor.shape().DebugString();
    }
    auto flat = splits_tensor.flat<int64_t>();
    int64_t total = 0;
    for (int i = 0; i < size; ++i) {
      if (flat(i) < 0) return what + "splits must be non-negative";
      splits->push_back(flat(i));
      total += flat(i);
    }
    if (total != rows) {
      return what + "splits sum to " + std::to_string(total) + " but the first dimension is " +
             std::to_string(rows);
    }
    return "";
  }
};

class ReducescatterKernel : public CollectiveKernel {
 public:
  explicit ReducescatterKernel(OpKernelConstruction* c) : CollectiveKernel(c) {
    int op = 0;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    OP_REQUIRES(c, IsValidReduceOp(op), absl::InvalidArgumentError("invalid reduce_op"));
    reduce_op_ = static_cast<ReduceOp>(op);
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ProcessSetMembership set;
    OP_REQUIRES_OK_ASYNC(ctx, Membership(&set), done);
    std::string call_name;
    OP_REQUIRES_OK_ASYNC(ctx, CallName(ctx, &call_name), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, 1);
    std::vector<TensorEntry> entries(1);
    TensorEntry& e = entries[0];
    OP_REQUIRES_OK_ASYNC(ctx, Describe(call_name, ctx, 0, 1, &e), done);
    e.type = CollectiveType::kReducescatter;
    e.reduce_op = reduce_op_;
    e.prescale = prescale_;
    e.postscale = postscale_;
    if (e.shape.empty()) {
      e.local_error = "reducescatter of '" + e.name + "' needs a tensor of rank >= 1, got a scalar";
    } else {
      std::vector<int64_t> out_shape = e.shape;
      out_shape[0] = ReducescatterRows(e.shape[0], static_cast<int>(set.ranks.size()), set.rank);
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, bridge::ToShape(out_shape), &out), done);
      e.output = const_cast<char*>(out->tensor_data().data());
    }
    e.done = DoneFor(completion, ctx->input(0));
    Submit(ctx, std::move(entries), completion, done);
  }

 private:
  ReduceOp reduce_op_ = ReduceOp::kSum;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

class BarrierKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::string call_name;
    OP_REQUIRES_OK_ASYNC(ctx, CallName(ctx, &call_name), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, 1);
    std::vector<TensorEntry> entries(1);
    entries[0].name = std::move(call_name);
    entries[0].process_set_id = process_set_id_;
    entries[0].type = CollectiveType::kBarrier;
    entries[0].done = [completion](const Status& s) { completion->EntryDone(s); };
    Submit(ctx, std::move(entries), completion, done);
  }
};

// Horovod's join(): completes once every rank has joined; meanwhile the
// engine lets this rank take part in the others' collectives without data.
// Its one output is a host scalar on either device, so its entry stays a host
// entry (as Barrier's, which has no tensor at all).
class JoinKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor* last_joined = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &last_joined), done);
    auto completion = std::make_shared<OpCompletion>(ctx, done, 1);
    std::vector<TensorEntry> entries(1);
    entries[0].name = kJoinName;
    entries[0].type = CollectiveType::kJoin;
    entries[0].dtype = DataType::kInt32;
    entries[0].output = last_joined->scalar<int32_t>().data();
    entries[0].done = [completion](const Status& s) { completion->EntryDone(s); };
    Submit(ctx, std::move(entries), completion, done);
  }
};

REGISTER_KERNEL_BUILDER(Name("SmdistAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistAllgather").Device(tensorflow::DEVICE_CPU), AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistReducescatter").Device(tensorflow::DEVICE_CPU),
                        ReducescatterKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistBarrier").Device(tensorflow::DEVICE_CPU), BarrierKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistJoin").Device(tensorflow::DEVICE_CPU), JoinKernel);

#if GOOGLE_CUDA
// The same classes on the GPU. What the kernel itself reads or writes on the
// host is HostMemory: the name, alltoall's splits and received splits, join's
// result. Data tensors are device memory, handed to the engine as they are.
REGISTER_KERNEL_BUILDER(Name("SmdistAllreduce").Device(tensorflow::DEVICE_GPU).HostMemory("tensor_name"),
                        AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistBroadcast").Device(tensorflow::DEVICE_GPU).HostMemory("tensor_name"),
                        BroadcastKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistAllgather").Device(tensorflow::DEVICE_GPU).HostMemory("tensor_name"),
                        AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistAlltoall")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("splits")
                            .HostMemory("tensor_name")
                            .HostMemory("received_splits"),
                        AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistReducescatter").Device(tensorflow::DEVICE_GPU).HostMemory("tensor_name"),
                        ReducescatterKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistBarrier").Device(tensorflow::DEVICE_GPU).HostMemory("tensor_name"),
                        BarrierKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistJoin").Device(tensorflow::DEVICE_GPU).HostMemory("last_joined_rank"),
                        JoinKernel);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace smdist
