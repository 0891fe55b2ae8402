// Runs the custom calls of XLA-compiled collectives in the engine: the call's
// buffers become engine entries, described as the framework kernels describe
// theirs (names "name.i" in a group), so calls issued together are negotiated
// and fused together, and a mismatch fails on every rank.
#include "collective_handler.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collective_call.h"
#include "engine.h"
#include "xla/ffi/api/ffi.h"

namespace smdist {
namespace {

namespace ffi = xla::ffi;

bool ToEngineType(ffi::DataType dt, DataType* out) {
  switch (dt) {
    case ffi::DataType::PRED: *out = DataType::kBool; return true;
    case ffi::DataType::U8: *out = DataType::kUInt8; return true;
    case ffi::DataType::S8: *out = DataType::kInt8; return true;
    case ffi::DataType::U16: *out = DataType::kUInt16; return true;
    case ffi::DataType::S16: *out = DataType::kInt16; return true;
    case ffi::DataType::S32: *out = DataType::kInt32; return true;
    case ffi::DataType::S64: *out = DataType::kInt64; return true;
    case ffi::DataType::F16: *out = DataType::kFloat16; return true;
    case ffi::DataType::BF16: *out = DataType::kBFloat16; return true;
    case ffi::DataType::F32: *out = DataType::kFloat32; return true;
    case ffi::DataType::F64: *out = DataType::kFloat64; return true;
    default: return false;
  }
}

// The error the framework raises matches its own kernels' for the same failure.
ffi::Error ToFfiError(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message());
    case StatusCode::kPreconditionFailed: return ffi::Error(ffi::ErrorCode::kFailedPrecondition, s.message());
    case StatusCode::kAborted: return ffi::Error(ffi::ErrorCode::kAborted, s.message());
    default: return ffi::Error(ffi::ErrorCode::kUnknown, s.message());
  }
}

Status FromFfiError(const ffi::Error& error) { return Status::InvalidArgument(error.message()); }

// Fills `e` from argument `index` and result `index`.
Status Describe(const xla_call::CallParameters& p, const ffi::AnyBuffer& in, const ffi::AnyBuffer& out, int index,
                int count, TensorEntry* e) {
  if (!ToEngineType(in.element_type(), &e->dtype)) {
    return Status::InvalidArgument("smdist_tf does not support XLA element type " +
                                   std::to_string(static_cast<int>(in.element_type())));
  }
  e->name = count == 1 ? p.name : p.name + "." + std::to_string(index);
  e->type = static_cast<CollectiveType>(p.type);
  e->process_set_id = static_cast<int32_t>(p.process_set_id);
  for (int64_t d : in.dimensions()) e->shape.push_back(d);
  e->input = in.untyped_data();
  e->reduce_op = static_cast<ReduceOp>(p.reduce_op);
  e->prescale = p.prescale;
  e->postscale = p.postscale;
  e->compression = static_cast<WireCompression>(p.compression);
  e->root_rank = static_cast<int32_t>(p.root_rank);
  void* data = out.untyped_data();
  if (e->type == CollectiveType::kAllgather || e->type == CollectiveType::kAlltoall) {
    // XLA allocated the output when it compiled: negotiation makes every rank
    // pass the same first dimension, so the shape it fixes is this one.
    e->same_first_dim = true;
    std::vector<int64_t> compiled(out.dimensions().begin(), out.dimensions().end());
    e->allocate_output = [compiled, data, name = e->name](const std::vector<int64_t>& shape, void** where) {
      if (shape != compiled) {
        return Status::InvalidArgument("XLA compiled '" + name + "' for another output shape than negotiation gave");
      }
      *where = data;
      return Status::OK();
    };
    if (e->type == CollectiveType::kAlltoall) {
      ProcessSetMembership set;
      SMDIST_RETURN_IF_ERROR(Engine::Instance().Membership(e->process_set_id, &set, /*require_member=*/true));
      const int64_t size = static_cast<int64_t>(set.ranks.size());
      if (e->shape.empty() || e->shape[0] % size != 0) {
        // Reported through negotiation, so every rank fails alike.
        e->local_error = "alltoall of '" + e->name + "' compiled by XLA takes equal splits: its first dimension (" +
                         (e->shape.empty() ? std::string("none: a scalar") : std::to_string(e->shape[0])) +
                         ") must divide evenly by the " + std::to_string(size) + " ranks";
      } else {
        e->splits.assign(size, e->shape[0] / size);
      }
    }
  } else {
    e->output = data;
  }
  return Status::OK();
}

// The call's buffers as engine entries (one result per argument); `done` of each left to the caller.
Status DescribeAll(const xla_call::CallParameters& p, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   std::vector<TensorEntry>* entries) {
  const int count = static_cast<int>(args.size());
  if (count == 0 || rets.size() != args.size()) {
    return Status::InvalidArgument("smdist_collective of '" + p.name + "' takes one result per argument");
  }
  entries->resize(count);
  for (int i = 0; i < count; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> in = args.get<ffi::AnyBuffer>(i);
    if (!in.has_value()) return FromFfiError(in.error());
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> out = rets.get<ffi::AnyBuffer>(i);
    if (!out.has_value()) return FromFfiError(out.error());
    SMDIST_RETURN_IF_ERROR(Describe(p, *in, **out, i, count, &(*entries)[i]));
  }
  return Status::OK();
}

ffi::Future Failed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

ffi::Future RunOnHost(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t type, std::string_view name,
                      int64_t process_set_id, int64_t reduce_op, double prescale, double postscale,
                      int64_t compression, int64_t root_rank) {
  const xla_call::CallParameters p{type,     std::string(name), process_set_id, reduce_op,
                                   prescale, postscale,         compression,    root_rank};
  std::vector<TensorEntry> entries;
  Status s = DescribeAll(p, args, rets, &entries);
  if (!s.ok()) return Failed(ToFfiError(s));
  ffi::CountDownPromise pending(entries.size());
  ffi::Future future(pending);
  for (TensorEntry& e : entries) {
    e.done = [pending](const Status& status) mutable {
      pending.CountDown(status.ok() ? ffi::Error::Success() : ToFfiError(status));
    };
  }
  // The calling thread may run the engine cycle itself, as the TensorFlow
  // allreduce kernel does: a collective XLA waits on gets there sooner.
  s = Engine::Instance().Enqueue(std::move(entries), /*run_inline=*/true);
  if (!s.ok()) return Failed(ToFfiError(s));  // nothing was queued, no done runs
  return future;
}

// Counts the entries' `done` calls; the first error wins.
class QueuedLatch {
 public:
  explicit QueuedLatch(size_t count) : remaining_(count) {}
  void Done(const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status.ok() && error_.ok()) error_ = status;
    if (--remaining_ == 0) cv_.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return remaining_ == 0; });
    return error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t remaining_;
  Status error_ = Status::OK();
};

ffi::Error RunOnCudaStream(void* stream, int32_t device_ordinal, ffi::RemainingArgs args, ffi::RemainingRets rets,
                           int64_t type, std::string_view name, int64_t process_set_id, int64_t reduce_op,
                           double prescale, double postscale, int64_t compression, int64_t root_rank) {
  const xla_call::CallParameters p{type,     std::string(name), process_set_id, reduce_op,
                                   prescale, postscale,         compression,    root_rank};
  std::vector<TensorEntry> entries;
  Status s = DescribeAll(p, args, rets, &entries);
  if (!s.ok()) return ToFfiError(s);
  auto latch = std::make_shared<QueuedLatch>(entries.size());
  for (TensorEntry& e : entries) {
    // XLA's stream orders the work: the inputs are ready on it, the results are read after it.
    e.device = Device::Gpu(device_ordinal);
    e.stream = stream;
    e.done = [latch](const Status& status) { latch->Done(status); };
  }
  s = Engine::Instance().Enqueue(std::move(entries), /*run_inline=*/true);
  if (!s.ok()) return ToFfiError(s);  // nothing was queued, no done runs
  // For a GPU entry `done` means "queued on the stream", not "finished": this
  // waits for negotiation and the enqueue, never for the device.
  s = latch->Wait();
  return s.ok() ? ffi::Error::Success() : ToFfiError(s);
}

// Both handlers bind the same attributes, in collective_call.h's order.
template <typename Binding>
auto BindAttributes(Binding binding) {
  return std::move(binding)
      .template Attr<int64_t>(xla_call::kType)
      .template Attr<std::string_view>(xla_call::kName)
      .template Attr<int64_t>(xla_call::kProcessSetId)
      .template Attr<int64_t>(xla_call::kReduceOp)
      .template Attr<double>(xla_call::kPrescale)
      .template Attr<double>(xla_call::kPostscale)
      .template Attr<int64_t>(xla_call::kCompression)
      .template Attr<int64_t>(xla_call::kRootRank);
}

}  // namespace
}  // namespace smdist

XLA_FFI_DEFINE_HANDLER_SYMBOL(smdist_xla_collective_host, smdist::RunOnHost,
                              smdist::BindAttributes(xla::ffi::Ffi::Bind().RemainingArgs().RemainingRets()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(smdist_xla_collective_cuda, smdist::RunOnCudaStream,
                              smdist::BindAttributes(xla::ffi::Ffi::Bind()
                                                         .Ctx<xla::ffi::PlatformStream<void*>>()
                                                         .Ctx<xla::ffi::DeviceOrdinal>()
                                                         .RemainingArgs()
                                                         .RemainingRets()));
