#include "control/message.h"

#include "control/wire_format.h"

namespace smdist {
namespace {

void PutRequest(const Request& r, WireWriter* w) {
  w->Put<int32_t>(r.rank);
  w->PutString(r.name);
  w->Put<int32_t>(static_cast<int32_t>(r.type));
  w->Put<int32_t>(static_cast<int32_t>(r.dtype));
  w->PutInts(r.shape);
  w->Put<int32_t>(r.device.id);
  w->Put<int32_t>(r.root_rank);
  w->Put<int32_t>(static_cast<int32_t>(r.reduce_op));
  w->Put<double>(r.prescale);
  w->Put<double>(r.postscale);
  w->Put<int32_t>(static_cast<int32_t>(r.compression));
  w->PutInts(r.splits);
  w->Put<uint8_t>(r.same_first_dim ? 1 : 0);
  w->PutString(r.error);
  w->Put<uint8_t>(r.cached ? 1 : 0);
}

Request GetRequest(WireReader* rd) {
  Request r;
  r.rank = rd->Get<int32_t>();
  r.name = rd->GetString();
  r.type = static_cast<CollectiveType>(rd->Get<int32_t>());
  r.dtype = static_cast<DataType>(rd->Get<int32_t>());
  r.shape = rd->GetInts();
  r.device.id = rd->Get<int32_t>();
  r.root_rank = rd->Get<int32_t>();
  r.reduce_op = static_cast<ReduceOp>(rd->Get<int32_t>());
  r.prescale = rd->Get<double>();
  r.postscale = rd->Get<double>();
  r.compression = static_cast<WireCompression>(rd->Get<int32_t>());
  r.splits = rd->GetInts();
  r.same_first_dim = rd->Get<uint8_t>() != 0;
  r.error = rd->GetString();
  r.cached = rd->Get<uint8_t>() != 0;
  return r;
}

}  // namespace

std::vector<uint8_t> RequestList::Serialize() const {
  WireWriter w;
  w.Put<uint8_t>(shutdown ? 1 : 0);
  w.PutString(failure);
  w.PutString(relayed_stop);
  w.Put<int32_t>(relayed_failed_peer);
  w.Put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const Request& r : requests) PutRequest(r, &w);
  return std::move(w.bytes());
}

bool RequestList::Parse(const uint8_t* data, size_t size, RequestList* out) {
  WireReader rd(data, size);
  out->shutdown = rd.Get<uint8_t>() != 0;
  out->failure = rd.GetString();
  out->relayed_stop = rd.GetString();
  out->relayed_failed_peer = rd.Get<int32_t>();
  auto n = rd.Get<uint32_t>();
  out->requests.clear();
  for (uint32_t i = 0; i < n && rd.ok(); ++i) out->requests.push_back(GetRequest(&rd));
  return rd.ok() && rd.done();
}

std::vector<uint8_t> ResponseList::Serialize() const {
  WireWriter w;
  w.Put<uint8_t>(shutdown ? 1 : 0);
  w.PutString(shutdown_error);
  w.Put<int32_t>(failed_peer);
  w.Put<uint32_t>(static_cast<uint32_t>(evictions.size()));
  for (const auto& name : evictions) w.PutString(name);
  w.Put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const Response& r : responses) {
    w.Put<int32_t>(static_cast<int32_t>(r.response_type));
    w.Put<int32_t>(static_cast<int32_t>(r.type));
    w.Put<uint32_t>(static_cast<uint32_t>(r.names.size()));
    for (const auto& name : r.names) w.PutString(name);
    w.PutString(r.error);
    w.Put<uint8_t>(r.invalid_input ? 1 : 0);
    w.PutInts(r.sizes);
    w.Put<uint32_t>(static_cast<uint32_t>(r.joined.size()));
    for (int32_t rank : r.joined) w.Put<int32_t>(rank);
    w.Put<uint32_t>(static_cast<uint32_t>(r.params.size()));
    for (const Request& p : r.params) PutRequest(p, &w);
    w.Put<int32_t>(r.last_joined);
  }
  return std::move(w.bytes());
}

bool ResponseList::Parse(const uint8_t* data, size_t size, ResponseList* out) {
  WireReader rd(data, size);
  out->shutdown = rd.Get<uint8_t>() != 0;
  out->shutdown_error = rd.GetString();
  out->failed_peer = rd.Get<int32_t>();
  auto evictions = rd.Get<uint32_t>();
  out->evictions.clear();
  for (uint32_t i = 0; i < evictions && rd.ok(); ++i) out->evictions.push_back(rd.GetString());
  auto n = rd.Get<uint32_t>();
  out->responses.clear();
  for (uint32_t i = 0; i < n && rd.ok(); ++i) {
    Response r;
    r.response_type = static_cast<ResponseType>(rd.Get<int32_t>());
    r.type = static_cast<CollectiveType>(rd.Get<int32_t>());
    auto names = rd.Get<uint32_t>();
    for (uint32_t j = 0; j < names && rd.ok(); ++j) r.names.push_back(rd.GetString());
    r.error = rd.GetString();
    r.invalid_input = rd.Get<uint8_t>() != 0;
    r.sizes = rd.GetInts();
    auto joined = rd.Get<uint32_t>();
    for (uint32_t j = 0; j < joined && rd.ok(); ++j) r.joined.push_back(rd.Get<int32_t>());
    auto params = rd.Get<uint32_t>();
    for (uint32_t j = 0; j < params && rd.ok(); ++j) r.params.push_back(GetRequest(&rd));
    r.last_joined = rd.Get<int32_t>();
    out->responses.push_back(std::move(r));
  }
  return rd.ok() && rd.done();
}

}  // namespace smdist
