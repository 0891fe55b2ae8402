// Runs the custom calls of XLA-compiled collectives (xla_collective_kernels.cc)
// in the engine. The handler queues the call's buffers as engine entries and
// returns a future that completes when the engine is done with all of them,
// so XLA goes on with independent work meanwhile, and calls issued together
// are negotiated and fused together, as TensorFlow's asynchronous kernels are.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine.h"
#include "xla/ffi/api/ffi.h"
#include "xla_collective_call.h"

namespace xla {
namespace ffi {
// XLA's FFI API inside this process (libtensorflow_cc exports it).
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace ffi
}  // namespace xla

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

// The error TensorFlow raises matches the TensorFlow kernels' for the same failure.
ffi::Error ToFfiError(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message());
    case StatusCode::kPreconditionFailed: return ffi::Error(ffi::ErrorCode::kFailedPrecondition, s.message());
    case StatusCode::kAborted: return ffi::Error(ffi::ErrorCode::kAborted, s.message());
    default: return ffi::Error(ffi::ErrorCode::kUnknown, s.message());
  }
}

ffi::Future Failed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

// Fills `e` from argument `index` and result `index`, as the TensorFlow
// kernel describes its tensors (names "name.i" in a group).
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
      e->splits.assign(size, e->shape[0] / size);
    }
  } else {
    e->output = data;
  }
  return Status::OK();
}

ffi::Future RunCollective(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t type, std::string_view name,
                          int64_t process_set_id, int64_t reduce_op, double prescale, double postscale,
                          int64_t compression, int64_t root_rank) {
  const xla_call::CallParameters p{type,      std::string(name), process_set_id, reduce_op,
                                   prescale,  postscale,         compression,    root_rank};
  const int count = static_cast<int>(args.size());
  if (count == 0 || rets.size() != args.size()) {
    return Failed(ffi::Error::InvalidArgument("smdist_collective of '" + p.name + "' takes one result per argument"));
  }
  ffi::CountDownPromise pending(count);
  ffi::Future future(pending);
  std::vector<TensorEntry> entries(count);
  for (int i = 0; i < count; ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> in = args.get<ffi::AnyBuffer>(i);
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value()) return Failed(in.error());
    if (!out.has_value()) return Failed(out.error());
    Status s = Describe(p, *in, **out, i, count, &entries[i]);
    if (!s.ok()) return Failed(ToFfiError(s));
    entries[i].done = [pending](const Status& status) mutable {
      pending.CountDown(status.ok() ? ffi::Error::Success() : ToFfiError(status));
    };
  }
  // The calling thread may run the engine cycle itself, as the TensorFlow
  // allreduce kernel does: a collective XLA waits on gets there sooner.
  Status s = Engine::Instance().Enqueue(std::move(entries), /*run_inline=*/true);
  if (!s.ok()) return Failed(ToFfiError(s));  // nothing was queued, no done runs
  return future;
}

XLA_FFI_DEFINE_HANDLER(kRunCollective, RunCollective,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<int64_t>(xla_call::kType)
                           .Attr<std::string_view>(xla_call::kName)
                           .Attr<int64_t>(xla_call::kProcessSetId)
                           .Attr<int64_t>(xla_call::kReduceOp)
                           .Attr<double>(xla_call::kPrescale)
                           .Attr<double>(xla_call::kPostscale)
                           .Attr<int64_t>(xla_call::kCompression)
                           .Attr<int64_t>(xla_call::kRootRank));

XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), xla_call::kTarget, "Host", kRunCollective);

}  // namespace
}  // namespace smdist
