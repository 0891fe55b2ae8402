// Compression.fp16 / Compression.bf16 done inside the engine: float tensors
// are narrowed on the way in (into the shared-memory rounds, or the fusion
// buffer) and widened into the outputs on the way out, each in one pass that
// also applies the scaling, so the reduction moves half the bytes.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace smdist {

// out[i] = wire(in[i] * scale) for i < count; `dtype` is floating point.
void NarrowToWire(DataType dtype, const void* in, DataType wire, void* out, int64_t count,
                  double scale);

// out[i] = dtype(float(in[i]) * scale) for i < count.
void WidenFromWire(DataType wire, const void* in, DataType dtype, void* out, int64_t count,
                   double scale);

}  // namespace smdist
