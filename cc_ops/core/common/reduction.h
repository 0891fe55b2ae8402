// Element-wise reduction and scaling kernels on raw buffers. Used by the
// transports (as MPI user ops for types MPI lacks) and by the collectives
// for Average and pre/post scaling.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace smdist {

// inout[i] = op(in[i], inout[i]) for i < count. fp16/bf16 compute in float32;
// Min/Max propagate NaN as TensorFlow's minimum/maximum do.
void ReduceInto(DataType dtype, ReduceOp op, const void* in, void* inout, int64_t count);

// out[i] = op over inputs[0..n)[i]. 16-bit floats accumulate every input in
// float32 and round once. `out` may alias inputs[0].
void ReduceMany(DataType dtype, ReduceOp op, const void* const* inputs, int n, void* out,
                int64_t count);

// ReduceMany, then ScaleInPlace(out, scale), with the same result bit for bit;
// float sums do both in one pass over memory.
void ReduceManyThenScale(DataType dtype, ReduceOp op, const void* const* inputs, int n, void* out,
                         int64_t count, double scale);

// buf[i] *= factor. Integers are scaled in double and truncated toward zero.
void ScaleInPlace(DataType dtype, void* buf, int64_t count, double factor);

// out[i] = in[i] * factor, rounding as ScaleInPlace; a copy when factor is 1.
// `out` may alias `in`.
void ScaleInto(DataType dtype, const void* in, void* out, int64_t count, double factor);

// Integer average: buf[i] /= divisor, truncating toward zero like C++ and
// tf.math.truncatediv.
void DivideInPlace(DataType dtype, void* buf, int64_t count, int64_t divisor);

// data[i] = the identity of `op` (0 for Sum/Average, 1 for Product, the
// largest value or +inf for Min, the lowest or -inf for Max): what a rank
// that has joined contributes, leaving the others' result unchanged.
void FillIdentity(DataType dtype, ReduceOp op, void* data, int64_t count);

}  // namespace smdist
