#include "transports/mpi/p2p_header.h"

#include <cstring>

namespace smdist {
namespace {

constexpr uint32_t kMagic = 0x50325053;  // "SP2P"
constexpr int kMaxTensors = 1 << 16;
constexpr int kMaxDims = 64;

void Put(std::vector<uint8_t>* out, int64_t v) {
  const size_t at = out->size();
  out->resize(at + sizeof(v));
  std::memcpy(out->data() + at, &v, sizeof(v));
}

bool Get(const uint8_t* bytes, int64_t length, int64_t* pos, int64_t* v) {
  if (*pos + static_cast<int64_t>(sizeof(*v)) > length) return false;
  std::memcpy(v, bytes + *pos, sizeof(*v));
  *pos += sizeof(*v);
  return true;
}

}  // namespace

int64_t PayloadBytes(const std::vector<TensorSignature>& signature) {
  int64_t total = 0;
  for (const TensorSignature& t : signature) total += t.bytes();
  return total;
}

// Layout, all int64: magic, header length, tensor count, then per tensor
// dtype, rank, dims...; optional padding to reach the header length.
std::vector<uint8_t> EncodeP2pHeader(const std::vector<TensorSignature>& signature,
                                     int64_t avoid_total) {
  std::vector<uint8_t> out;
  Put(&out, kMagic);
  Put(&out, 0);  // header length, filled in below
  Put(&out, static_cast<int64_t>(signature.size()));
  for (const TensorSignature& t : signature) {
    Put(&out, static_cast<int64_t>(t.dtype));
    Put(&out, static_cast<int64_t>(t.shape.size()));
    for (int64_t d : t.shape) Put(&out, d);
  }
  if (static_cast<int64_t>(out.size()) + PayloadBytes(signature) == avoid_total) Put(&out, 0);
  const int64_t length = static_cast<int64_t>(out.size());
  std::memcpy(out.data() + sizeof(int64_t), &length, sizeof(length));
  return out;
}

Status DecodeP2pHeader(const uint8_t* bytes, int64_t length, std::vector<TensorSignature>* signature,
                       int64_t* header_bytes) {
  const Status corrupt = Status::Unknown("corrupt point-to-point message header");
  int64_t pos = 0, magic = 0, header_length = 0, count = 0;
  if (!Get(bytes, length, &pos, &magic) || magic != kMagic) return corrupt;
  if (!Get(bytes, length, &pos, &header_length) || header_length > length) return corrupt;
  if (!Get(bytes, length, &pos, &count) || count < 0 || count > kMaxTensors) return corrupt;
  signature->assign(count, TensorSignature());
  for (TensorSignature& t : *signature) {
    int64_t dtype = 0, rank = 0;
    if (!Get(bytes, length, &pos, &dtype) || dtype < 0 ||
        dtype > static_cast<int64_t>(DataType::kInt16)) {
      return corrupt;
    }
    if (!Get(bytes, length, &pos, &rank) || rank < 0 || rank > kMaxDims) return corrupt;
    t.dtype = static_cast<DataType>(dtype);
    t.shape.resize(rank);
    for (int64_t& d : t.shape) {
      if (!Get(bytes, length, &pos, &d) || d < 0) return corrupt;
    }
  }
  if (pos > header_length || header_length + PayloadBytes(*signature) != length) return corrupt;
  *header_bytes = header_length;
  return Status::OK();
}

}  // namespace smdist
