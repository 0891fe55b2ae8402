// Compression.int8's wire format. fp32 values are cut into blocks of
// kInt8BlockElements; each block travels as one fp32 scale (its largest
// magnitude / 127) and one int8 per element (value / scale, rounded to
// nearest), so a block's values come back within scale / 2 = max|x| / 254.
#pragma once

#include <cstdint>

namespace smdist {

constexpr int64_t kInt8BlockElements = 256;

// Bytes that `count` values take on the wire: the blocks' scales, then the int8s.
int64_t Int8WireBytes(int64_t count);

// Writes `in[0, count)` to `wire` in the format above. A block holding an
// infinity or NaN gets a NaN scale, so it comes back as NaN (a non-finite
// gradient stays non-finite, as mixed precision's loss scaling needs).
void QuantizeInt8Blocks(const float* in, int64_t count, uint8_t* wire);

// out[i] = the value `wire` holds for element i, or out[i] += it when
// `accumulate` (the reduce step: dequantize and add in fp32).
void DequantizeInt8Blocks(const uint8_t* wire, int64_t count, float* out, bool accumulate);

}  // namespace smdist
