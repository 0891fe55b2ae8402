// XLA lowerings of the collectives, so they run inside jit_compile functions.
// Each op becomes one custom call (cc_ops/xla/collective_call.h) that hands its
// buffers to the engine when XLA runs it (cc_ops/xla/collective_handler.cc), so
// negotiation, fusion, the response cache and the timeline apply as for the
// TensorFlow kernels.
//
// XLA fixes every shape at compile time. Allgather and alltoall outputs
// depend on the other ranks' inputs, so compiled they take equal first
// dimensions on every rank (checked in negotiation, an error on all ranks),
// and alltoall only equal splits. Registered for XLA_CPU_JIT, and for
// XLA_GPU_JIT in the GPU variant (GOOGLE_CUDA), where compressed allreduces cast
// on the device around the call so fp16/bf16 go to NCCL.
#include <string>
#include <vector>

#include "collective_call.h"
#include "common/reducescatter_rows.h"
#include "engine.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tf_engine_bridge.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"
#include "xla_late_compilation_kernels.h"

namespace smdist {
namespace {

using tensorflow::XlaOpKernel;
using tensorflow::XlaOpKernelContext;

// What every lowering shares: the name, the process set and emitting the call.
class CollectiveLowering : public XlaOpKernel {
 public:
  explicit CollectiveLowering(tensorflow::OpKernelConstruction* c) : XlaOpKernel(c) {
    if (c->HasAttr("process_set_id")) OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }

 protected:
  // The name input (always last) must be a compile-time constant; empty means
  // the node's name, as for the TensorFlow kernel.
  absl::Status CallName(XlaOpKernelContext* ctx, std::string* out) const {
    absl::StatusOr<tensorflow::Tensor> name = ctx->ConstantInputTensor(ctx->num_inputs() - 1);
    if (!name.ok()) return name.status();
    if (name->NumElements() != 1) return absl::InvalidArgumentError("tensor_name must be a scalar string");
    *out = std::string(name->flat<tensorflow::tstring>()(0));
    if (out->empty()) *out = def().name();
    return absl::OkStatus();
  }

  // This rank's place in the op's process set, known when XLA compiles; the
  // same error as the TensorFlow kernel's for a set this rank is not in.
  absl::Status Membership(ProcessSetMembership* set) const {
    return tf_bridge::ToTfStatus(Engine::Instance().Membership(process_set_id_, set, /*require_member=*/true));
  }

  // The parameters every op has; each adds its own.
  xla_call::CallParameters Parameters(CollectiveType type, const std::string& name) const {
    xla_call::CallParameters p;
    p.type = static_cast<int64_t>(type);
    p.name = name;
    p.process_set_id = process_set_id_;
    return p;
  }

  // One custom call over `operands`, returning a tuple of `results`; with
  // `in_place`, result i may reuse operand i's buffer. Side-effecting: XLA
  // must neither drop nor merge two calls, which every rank has to make.
  static std::vector<xla::XlaOp> Emit(XlaOpKernelContext* ctx, const std::vector<xla::XlaOp>& operands,
                                      const std::vector<xla::Shape>& results, const xla_call::CallParameters& parameters,
                                      bool in_place) {
    std::vector<std::pair<xla::ShapeIndex, std::pair<int64_t, xla::ShapeIndex>>> aliasing;
    if (in_place) {
      for (int64_t i = 0; i < static_cast<int64_t>(operands.size()); ++i) {
        aliasing.push_back({xla::ShapeIndex{i}, {i, xla::ShapeIndex{}}});
      }
    }
    xla::XlaOp call = xla::CustomCall(ctx->builder(), xla_call::kTarget, operands,
                                      xla::ShapeUtil::MakeTupleShape(results), xla_call::BackendConfig(parameters),
                                      /*has_side_effect=*/true, aliasing, /*literal=*/nullptr,
                                      xla::CustomCallSchedule::SCHEDULE_NONE, xla::API_VERSION_TYPED_FFI);
    std::vector<xla::XlaOp> outs;
    for (int64_t i = 0; i < static_cast<int64_t>(results.size()); ++i) outs.push_back(xla::GetTupleElement(call, i));
    return outs;
  }

  static absl::Status OperandShape(XlaOpKernelContext* ctx, int index, xla::Shape* shape) {
    absl::StatusOr<xla::Shape> s = ctx->builder()->GetShape(ctx->Input(index));
    if (!s.ok()) return s.status();
    *shape = *s;
    return absl::OkStatus();
  }

  int64_t process_set_id_ = 0;
};

// The reduce op and scale factors of allreduce and reducescatter.
struct Reduction {
  explicit Reduction(tensorflow::OpKernelConstruction* c) {
    int op = 0;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    OP_REQUIRES(c, IsValidReduceOp(op), absl::InvalidArgumentError("invalid reduce_op"));
    reduce_op = op;
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale));
  }
  void Fill(xla_call::CallParameters* p) const {
    p->reduce_op = reduce_op;
    p->prescale = prescale;
    p->postscale = postscale;
  }
  int reduce_op = 0;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

// Allreduce and broadcast: several tensors, each result shaped as its input.
class SameShapeLowering : public CollectiveLowering {
 public:
  using CollectiveLowering::CollectiveLowering;

  void Compile(XlaOpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, CallName(ctx, &name));
    const int n = ctx->num_inputs() - 1;
    std::vector<xla::XlaOp> operands;
    std::vector<xla::Shape> shapes(n);
    for (int i = 0; i < n; ++i) {
      operands.push_back(ctx->Input(i));
      OP_REQUIRES_OK(ctx, OperandShape(ctx, i, &shapes[i]));
    }
    xla_call::CallParameters parameters = Parameters(type(), name);
    AddParameters(&parameters);
    std::vector<xla::PrimitiveType> given(n);
    for (int i = 0; i < n; ++i) given[i] = shapes[i].element_type();
    ToWireTypes(ctx, &operands, &shapes, &parameters);
    std::vector<xla::XlaOp> outs = Emit(ctx, operands, shapes, parameters, /*in_place=*/true);
    for (int i = 0; i < n; ++i) {
      ctx->SetOutput(i, shapes[i].element_type() == given[i] ? outs[i] : xla::ConvertElementType(outs[i], given[i]));
    }
  }

 protected:
  virtual CollectiveType type() const = 0;
  virtual void AddParameters(xla_call::CallParameters* p) const = 0;
  // May cast operands (and their shapes) to the type they travel in; results are cast back.
  virtual void ToWireTypes(XlaOpKernelContext* ctx, std::vector<xla::XlaOp>* operands, std::vector<xla::Shape>* shapes,
                           xla_call::CallParameters* p) const {}
};

class AllreduceLowering : public SameShapeLowering {
 public:
  explicit AllreduceLowering(tensorflow::OpKernelConstruction* c) : SameShapeLowering(c), reduction_(c) {
    std::string compression;
    OP_REQUIRES_OK(c, c->GetAttr("compression", &compression));
    OP_REQUIRES(c, WireCompressionFromName(compression, &compression_),
                absl::InvalidArgumentError("unknown compression " + compression));
    on_gpu_ = c->device_type() == tensorflow::DeviceType(tensorflow::DEVICE_GPU_XLA_JIT);
  }

 protected:
  CollectiveType type() const override { return CollectiveType::kAllreduce; }
  void AddParameters(xla_call::CallParameters* p) const override {
    reduction_.Fill(p);
    p->compression = static_cast<int64_t>(compression_);
  }
  // On the GPU, compression casts on the device, as Horovod casts in the graph:
  // NCCL then reduces fp16/bf16 where the data is, instead of the engine
  // narrowing on the host-staged path. Int8 blocks need the engine's ring, so
  // they stay host-staged.
  void ToWireTypes(XlaOpKernelContext* ctx, std::vector<xla::XlaOp>* operands, std::vector<xla::Shape>* shapes,
                   xla_call::CallParameters* p) const override {
    if (compression_ == WireCompression::kNone || compression_ == WireCompression::kInt8 || !on_gpu_) return;
    const xla::PrimitiveType wire = compression_ == WireCompression::kFloat16 ? xla::F16 : xla::BF16;
    for (size_t i = 0; i < operands->size(); ++i) {
      const xla::PrimitiveType given = (*shapes)[i].element_type();
      if (given != xla::F32 && given != xla::F64) continue;  // compression narrows wider floats only
      (*operands)[i] = xla::ConvertElementType((*operands)[i], wire);
      (*shapes)[i].set_element_type(wire);
    }
    p->compression = static_cast<int64_t>(WireCompression::kNone);
  }

 private:
  Reduction reduction_;
  WireCompression compression_ = WireCompression::kNone;
  bool on_gpu_ = false;
};

class BroadcastLowering : public SameShapeLowering {
 public:
  explicit BroadcastLowering(tensorflow::OpKernelConstruction* c) : SameShapeLowering(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
  }

 protected:
  CollectiveType type() const override { return CollectiveType::kBroadcast; }
  void AddParameters(xla_call::CallParameters* p) const override { p->root_rank = root_rank_; }

 private:
  int root_rank_ = 0;
};

// Allgather, alltoall and reducescatter: one tensor whose first dimension
// changes; the rest of the shape stays. Refuses scalars, as the TensorFlow
// kernels do.
class FirstDimLowering : public CollectiveLowering {
 public:
  using CollectiveLowering::CollectiveLowering;

  void Compile(XlaOpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, CallName(ctx, &name));
    ProcessSetMembership set;
    OP_REQUIRES_OK(ctx, Membership(&set));
    xla::Shape shape;
    OP_REQUIRES_OK(ctx, OperandShape(ctx, 0, &shape));
    OP_REQUIRES(ctx, !shape.dimensions().empty(),
                absl::InvalidArgumentError(std::string(what()) + " of '" + name +
                                           "' needs a tensor of rank >= 1, got a scalar"));
    Lower(ctx, name, set, shape);
  }

 protected:
  virtual const char* what() const = 0;
  // Sets the op's outputs; `shape`: the input's, of rank >= 1.
  virtual void Lower(XlaOpKernelContext* ctx, const std::string& name, const ProcessSetMembership& set,
                     const xla::Shape& shape) = 0;

  static xla::Shape WithRows(xla::Shape shape, int64_t rows) {
    shape.set_dimensions(0, rows);
    return shape;
  }
};

class AllgatherLowering : public FirstDimLowering {
 public:
  using FirstDimLowering::FirstDimLowering;

 protected:
  const char* what() const override { return "allgather"; }
  void Lower(XlaOpKernelContext* ctx, const std::string& name, const ProcessSetMembership& set,
             const xla::Shape& shape) override {
    const int64_t rows = shape.dimensions(0) * static_cast<int64_t>(set.ranks.size());
    ctx->SetOutput(0, Emit(ctx, {ctx->Input(0)}, {WithRows(shape, rows)},
                           Parameters(CollectiveType::kAllgather, name), /*in_place=*/false)[0]);
  }
};

class AlltoallLowering : public FirstDimLowering {
 public:
  using FirstDimLowering::FirstDimLowering;

 protected:
  const char* what() const override { return "alltoall"; }
  void Lower(XlaOpKernelContext* ctx, const std::string& name, const ProcessSetMembership& set,
             const xla::Shape& shape) override {
    const int64_t size = static_cast<int64_t>(set.ranks.size());
    const int64_t rows = shape.dimensions(0);
    const std::string what = "alltoall of '" + name + "' compiled by XLA: ";
    OP_REQUIRES(ctx, rows % size == 0,
                absl::InvalidArgumentError(what + "first dimension " + std::to_string(rows) +
                                           " does not divide evenly by " + std::to_string(size) + " ranks"));
    // Only equal splits: with others the output's rows depend on what the
    // other ranks send, which XLA cannot know when it compiles.
    std::vector<int64_t> splits;
    OP_REQUIRES_OK(ctx, ctx->ConstantInputAsIntVector(1, &splits));
    for (int64_t s : splits) {
      OP_REQUIRES(ctx, static_cast<int64_t>(splits.size()) == size && s == rows / size,
                  absl::InvalidArgumentError(what + "takes only equal splits (none, or " + std::to_string(rows / size) +
                                             " rows for each of the " + std::to_string(size) +
                                             " ranks); call it outside jit_compile for uneven splits"));
    }
    ctx->SetOutput(0, Emit(ctx, {ctx->Input(0)}, {shape}, Parameters(CollectiveType::kAlltoall, name),
                           /*in_place=*/false)[0]);
    ctx->SetOutput(1, xla::ConstantR1<int64_t>(ctx->builder(), std::vector<int64_t>(size, rows / size)));
  }
};

class ReducescatterLowering : public FirstDimLowering {
 public:
  explicit ReducescatterLowering(tensorflow::OpKernelConstruction* c) : FirstDimLowering(c), reduction_(c) {}

 protected:
  const char* what() const override { return "reducescatter"; }
  void Lower(XlaOpKernelContext* ctx, const std::string& name, const ProcessSetMembership& set,
             const xla::Shape& shape) override {
    const int64_t rows = ReducescatterRows(shape.dimensions(0), static_cast<int>(set.ranks.size()), set.rank);
    xla_call::CallParameters parameters = Parameters(CollectiveType::kReducescatter, name);
    reduction_.Fill(&parameters);
    ctx->SetOutput(0, Emit(ctx, {ctx->Input(0)}, {WithRows(shape, rows)}, parameters, /*in_place=*/false)[0]);
  }

 private:
  Reduction reduction_;
};

// The name (and alltoall's splits) must be known when XLA compiles; the name
// is a string, which XLA kernels refuse unless allowed.
#if GOOGLE_CUDA
const absl::string_view kLoweredDevices[] = {tensorflow::DEVICE_CPU_XLA_JIT, tensorflow::DEVICE_GPU_XLA_JIT};
#else
const absl::string_view kLoweredDevices[] = {tensorflow::DEVICE_CPU_XLA_JIT};
#endif
#define SMDIST_XLA_COLLECTIVE(op)                     \
  Name(op)                                            \
      .Device(kLoweredDevices)                        \
      .AllowStringType()                              \
      .CompileTimeConstantInput("tensor_name")

REGISTER_XLA_OP(SMDIST_XLA_COLLECTIVE("SmdistAllreduce"), AllreduceLowering);
REGISTER_XLA_OP(SMDIST_XLA_COLLECTIVE("SmdistBroadcast"), BroadcastLowering);
REGISTER_XLA_OP(SMDIST_XLA_COLLECTIVE("SmdistAllgather"), AllgatherLowering);
REGISTER_XLA_OP(SMDIST_XLA_COLLECTIVE("SmdistAlltoall").CompileTimeConstantInput("splits"), AlltoallLowering);
REGISTER_XLA_OP(SMDIST_XLA_COLLECTIVE("SmdistReducescatter"), ReducescatterLowering);

template <class Lowering>
tensorflow::OpKernel* MakeLowering(tensorflow::OpKernelConstruction* c) {
  return new Lowering(c);
}

// After the registrations above (same file, so they ran first): gives them
// their XLA_*_JIT kernels even when TensorFlow had set up XLA before this
// library was loaded (see xla_late_compilation_kernels.h).
[[maybe_unused]] const bool kCompilationKernelsReady = [] {
  EnsureCompilationKernels(
      {
          {"SmdistAllreduce", &MakeLowering<AllreduceLowering>},
          {"SmdistBroadcast", &MakeLowering<BroadcastLowering>},
          {"SmdistAllgather", &MakeLowering<AllgatherLowering>},
          {"SmdistAlltoall", &MakeLowering<AlltoallLowering>},
          {"SmdistReducescatter", &MakeLowering<ReducescatterLowering>},
      },
      kLoweredDevices);
  return true;
}();

}  // namespace
}  // namespace smdist
