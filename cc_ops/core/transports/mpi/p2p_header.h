// Wire header of a point-to-point message. It travels only when the
// signature (dtypes and shapes) for a (peer, tag) pair changes; unchanged
// messages carry the raw tensor bytes alone.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transports/point_to_point.h"

namespace smdist {

int64_t PayloadBytes(const std::vector<TensorSignature>& signature);

// Header bytes for `signature`. `avoid_total` is a message length the
// receiver would read as "signature unchanged": the header is padded so
// header + payload never has that length.
std::vector<uint8_t> EncodeP2pHeader(const std::vector<TensorSignature>& signature,
                                     int64_t avoid_total);

// Parses a header at the start of `bytes`; `header_bytes` gets its length
// (the payload follows it).
Status DecodeP2pHeader(const uint8_t* bytes, int64_t length, std::vector<TensorSignature>* signature,
                       int64_t* header_bytes);

}  // namespace smdist
