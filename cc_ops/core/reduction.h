// Element-wise reduction and scaling kernels on raw buffers. Used by the
// transports (as MPI user ops for types MPI lacks) and by the collectives
// for Average and pre/post scaling.
#pragma once

#include <cstdint>

#include "types.h"

namespace smdist {

// inout[i] = op(in[i], inout[i]) for i < count. fp16/bf16 compute in float32;
// Min/Max propagate NaN as TensorFlow's minimum/maximum do.
void ReduceInto(DataType dtype, ReduceOp op, const void* in, void* inout, int64_t count);

// buf[i] *= factor. Integers are scaled in double and truncated toward zero.
void ScaleInPlace(DataType dtype, void* buf, int64_t count, double factor);

// Integer average: buf[i] /= divisor, truncating toward zero like C++ and
// tf.math.truncatediv.
void DivideInPlace(DataType dtype, void* buf, int64_t count, int64_t divisor);

}  // namespace smdist
