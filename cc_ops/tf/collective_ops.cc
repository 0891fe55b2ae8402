// Op registrations and shape functions. Every op is stateful so that
// tf.function keeps collectives in program order on every rank and never
// prunes or merges one (a rank skipping a collective would stall the rest).
// The name ranks match a collective by is the last input, not an attribute:
// TensorFlow keeps one eager kernel per distinct attribute set forever, so a
// name attribute cost ~36 KB per distinct name for the life of the process.
// An empty name means the node's own name (graphs). `process_set_id` names
// the ranks that take part (0: all); ranks and sizes are then the set's.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// Output 0 has the input's shape with an unknown first dimension.
absl::Status RaggedFirstDim(InferenceContext* c) {
  ShapeHandle in = c->input(0);
  if (!c->RankKnown(in)) {
    c->set_output(0, c->UnknownShape());
    return absl::OkStatus();
  }
  if (c->Rank(in) == 0) {
    c->set_output(0, c->Vector(c->UnknownDim()));
    return absl::OkStatus();
  }
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

absl::Status SameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("SmdistAllreduce")
    .Attr("T: list({uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double})")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("run_inline: bool = false")
    .Attr("compression: {'none', 'fp16', 'bf16', 'int8'} = 'none'")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Input("tensor_name: string")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Reduces each tensor across all ranks; tensors in one op are negotiated together and fused. "
         "run_inline: the calling thread may run the engine cycle itself instead of handing off to the "
         "engine thread. compression: floating-point tensors travel as float16/bfloat16.");

REGISTER_OP("SmdistBroadcast")
    .Attr("T: list({bool, uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double})")
    .Attr("root_rank: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Input("tensor_name: string")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Replaces each tensor with root_rank's value.");

REGISTER_OP("SmdistAllgather")
    .Attr("T: {bool, uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double}")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(RaggedFirstDim)
    .Doc("Concatenates every rank's tensor along the first dimension, in rank order.");

REGISTER_OP("SmdistAlltoall")
    .Attr("T: {bool, uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double}")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int64")
    .Input("tensor_name: string")
    .Output("output: T")
    .Output("received_splits: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RaggedFirstDim(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Sends splits[r] rows to rank r; returns the rows received and their counts per rank.");

REGISTER_OP("SmdistReducescatter")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double}")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(RaggedFirstDim)
    .Doc("Reduces across ranks and keeps this rank's block of the first dimension.");

REGISTER_OP("SmdistBarrier")
    .Attr("process_set_id: int = 0")
    .Input("tensor_name: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Completes once every rank has reached it.");

REGISTER_OP("SmdistJoin")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Completes once every rank has joined; until then the other ranks' collectives complete without this "
         "one. Outputs the rank that joined last.");
