// Thin CPU kernels for SmdistSend/SmdistRecv: describe the tensors and hand
// them to the engine's point-to-point channel. No communication happens here.
#include <memory>

#include "engine.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tf_engine_bridge.h"

namespace smdist {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace bridge = tf_bridge;

class SendKernel : public AsyncOpKernel {
 public:
  explicit SendKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("peer", &peer_));
    OP_REQUIRES_OK(c, c->GetAttr("tag", &tag_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    SendMessage message;
    message.peer = peer_;
    message.tag = tag_;
    // The channel keeps the inputs alive (TF buffers are reference counted)
    // until MPI has read them, so the op can complete right away.
    auto keep_alive = std::make_shared<std::vector<Tensor>>();
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      TensorSignature sig;
      if (!bridge::ToEngineType(t.dtype(), &sig.dtype)) {
        ctx->SetStatus(absl::InvalidArgumentError("smdist_tf cannot send dtype " +
                                                  tensorflow::DataTypeString(t.dtype())));
        done();
        return;
      }
      sig.shape = bridge::ToDims(t.shape());
      message.signature.push_back(std::move(sig));
      message.data.push_back(t.tensor_data().data());
      keep_alive->push_back(t);
    }
    message.release = [keep_alive]() { keep_alive->clear(); };
    Status s = Engine::Instance().Send(std::move(message));
    if (!s.ok()) ctx->SetStatus(bridge::ToTfStatus(s));
    done();
  }

 private:
  int peer_ = 0;
  int tag_ = 0;
};

class RecvKernel : public AsyncOpKernel {
 public:
  explicit RecvKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("peer", &peer_));
    OP_REQUIRES_OK(c, c->GetAttr("tag", &tag_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtypes_));
    OP_REQUIRES_OK(c, c->GetAttr("shapes", &hints_));
    OP_REQUIRES(c, hints_.empty() || hints_.size() == dtypes_.size(),
                absl::InvalidArgumentError("SmdistRecv: one shape hint per output expected"));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    RecvMessage message;
    message.peer = peer_;
    message.tag = tag_;
    message.allocate = [this, ctx](const std::vector<TensorSignature>& signature,
                                   std::vector<void*>* data) { return Allocate(ctx, signature, data); };
    message.done = [ctx, done](const Status& s) {
      if (!s.ok()) ctx->SetStatus(bridge::ToTfStatus(s));
      done();
    };
    Status s = Engine::Instance().Recv(std::move(message));
    if (!s.ok()) {
      ctx->SetStatus(bridge::ToTfStatus(s));
      done();
    }
  }

 private:
  // Runs on the channel's thread once the sender's signature is known.
  Status Allocate(OpKernelContext* ctx, const std::vector<TensorSignature>& signature,
                  std::vector<void*>* data) const {
    const std::string from = "message from rank " + std::to_string(peer_) + " (tag " +
                             std::to_string(tag_) + ")";
    if (signature.size() != dtypes_.size()) {
      return Status::InvalidArgument(from + " has " + std::to_string(signature.size()) +
                                     " tensors, expected " + std::to_string(dtypes_.size()));
    }
    for (size_t i = 0; i < signature.size(); ++i) {
      DataType expected;
      if (!bridge::ToEngineType(dtypes_[i], &expected) || expected != signature[i].dtype) {
        return Status::InvalidArgument(from + ": tensor " + std::to_string(i) + " is " +
                                       DataTypeName(signature[i].dtype) + ", expected " +
                                       tensorflow::DataTypeString(dtypes_[i]));
      }
      const tensorflow::TensorShape shape = bridge::ToShape(signature[i].shape);
      if (!hints_.empty() && !hints_[i].IsCompatibleWith(shape)) {
        return Status::InvalidArgument(from + ": tensor " + std::to_string(i) + " has shape " +
                                       shape.DebugString() + ", expected " + hints_[i].DebugString());
      }
      Tensor* out = nullptr;
      Status s = bridge::FromTfStatus(ctx->allocate_output(static_cast<int>(i), shape, &out));
      if (!s.ok()) return s;
      data->push_back(const_cast<char*>(out->tensor_data().data()));
    }
    return Status::OK();
  }

  int peer_ = 0;
  int tag_ = 0;
  tensorflow::DataTypeVector dtypes_;
  std::vector<tensorflow::PartialTensorShape> hints_;
};

REGISTER_KERNEL_BUILDER(Name("SmdistSend").Device(tensorflow::DEVICE_CPU), SendKernel);
REGISTER_KERNEL_BUILDER(Name("SmdistRecv").Device(tensorflow::DEVICE_CPU), RecvKernel);

}  // namespace
}  // namespace smdist
