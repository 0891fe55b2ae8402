#include "transports/data_transport.h"

namespace smdist {
namespace {
Status NotOffered(const DataTransport& t, const char* what) {
  return Status::Unknown(std::string("internal error: transport ") + t.name() + " was asked for " + what +
                         ", which its Enabled() does not accept");
}
}  // namespace

Status DataTransport::Allgatherv(const void*, void*, const std::vector<int64_t>&, DataType) {
  return NotOffered(*this, "allgather");
}
Status DataTransport::UseDevice(const Device&, void*) { return Status::OK(); }
Status DataTransport::Broadcast(const void*, void*, int64_t, DataType, int) {
  return NotOffered(*this, "broadcast");
}
Status DataTransport::Alltoallv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                                DataType) {
  return NotOffered(*this, "alltoall");
}
Status DataTransport::ReduceScatter(const void*, void*, const std::vector<int64_t>&, DataType, ReduceOp) {
  return NotOffered(*this, "reducescatter");
}

}  // namespace smdist
