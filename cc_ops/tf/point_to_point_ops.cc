// Registrations of the point-to-point ops used by pipeline parallelism.
// Stateful, like the collectives, so tf.function keeps them in program order
// and never prunes one (the peer would wait for it forever).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Outputs take the optional shape hints; unknown without them.
absl::Status HintedShapes(InferenceContext* c) {
  std::vector<tensorflow::PartialTensorShape> hints;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &hints));
  for (int i = 0; i < c->num_outputs(); ++i) {
    if (hints.empty()) {
      c->set_output(i, c->UnknownShape());
      continue;
    }
    ShapeHandle shape;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(hints[i], &shape));
    c->set_output(i, shape);
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("SmdistSend")
    .Attr("T: list({bool, uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double})")
    .Attr("peer: int")
    .Attr("tag: int = 0")
    .Input("tensors: T")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Sends the tensors to rank `peer` as one message; completes once queued, without "
         "waiting for the receiver.");

REGISTER_OP("SmdistRecv")
    .Attr("T: list({bool, uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double})")
    .Attr("peer: int")
    .Attr("tag: int = 0")
    .Attr("shapes: list(shape) = []")
    .Output("tensors: T")
    .SetIsStateful()
    .SetShapeFn(HintedShapes)
    .Doc("Receives the next message rank `peer` sent with `tag`; shapes come from the sender "
         "(`shapes` is a static hint, checked on arrival).");
