// Horovod's graph-mode topology ops (rank_op, size_op, ...): evaluated when
// the graph runs, not when it is built, so a saved graph reads the topology of
// the job that runs it.
#include <string>

#include "engine.h"
#include "tf_engine_bridge.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace smdist {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

enum class TopologyField { kRank, kSize, kLocalRank, kLocalSize, kProcessSetIncluded };

template <TopologyField kField>
class TopologyKernel : public OpKernel {
 public:
  explicit TopologyKernel(OpKernelConstruction* c) : OpKernel(c) {
    if (kField == TopologyField::kSize || kField == TopologyField::kProcessSetIncluded) {
      OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    Engine& engine = Engine::Instance();
    OP_REQUIRES(ctx, engine.initialized(),
                absl::FailedPreconditionError("smdist_tf has not been initialized: call smdist_tf.init() first"));
    ProcessSetMembership set;
    const Status known = engine.Membership(process_set_id_, &set);
    OP_REQUIRES(ctx, known.ok(), tf_bridge::ToTfStatus(known));
    const Topology t = engine.topology();
    int32_t value = 0;
    switch (kField) {
      case TopologyField::kRank: value = t.rank; break;
      case TopologyField::kSize: value = static_cast<int32_t>(set.ranks.size()); break;
      case TopologyField::kLocalRank: value = t.local_rank; break;
      case TopologyField::kLocalSize: value = t.local_size; break;
      case TopologyField::kProcessSetIncluded: value = set.rank >= 0 ? 1 : 0; break;
    }
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  int process_set_id_ = 0;
};

}  // namespace
}  // namespace smdist

// Stateful: the value depends on the job, so it must never be constant-folded.
REGISTER_OP("SmdistRank").Output("rank: int32").SetIsStateful().SetShapeFn(tensorflow::shape_inference::ScalarShape);
REGISTER_OP("SmdistLocalRank")
    .Output("local_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);
REGISTER_OP("SmdistLocalSize")
    .Output("local_size: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);
REGISTER_OP("SmdistSize")
    .Attr("process_set_id: int = 0")
    .Output("size: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);
REGISTER_OP("SmdistProcessSetIncluded")
    .Attr("process_set_id: int = 0")
    .Output("included: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("SmdistRank").Device(tensorflow::DEVICE_CPU),
                        smdist::TopologyKernel<smdist::TopologyField::kRank>);
REGISTER_KERNEL_BUILDER(Name("SmdistSize").Device(tensorflow::DEVICE_CPU),
                        smdist::TopologyKernel<smdist::TopologyField::kSize>);
REGISTER_KERNEL_BUILDER(Name("SmdistLocalRank").Device(tensorflow::DEVICE_CPU),
                        smdist::TopologyKernel<smdist::TopologyField::kLocalRank>);
REGISTER_KERNEL_BUILDER(Name("SmdistLocalSize").Device(tensorflow::DEVICE_CPU),
                        smdist::TopologyKernel<smdist::TopologyField::kLocalSize>);
REGISTER_KERNEL_BUILDER(Name("SmdistProcessSetIncluded").Device(tensorflow::DEVICE_CPU),
                        smdist::TopologyKernel<smdist::TopologyField::kProcessSetIncluded>);
