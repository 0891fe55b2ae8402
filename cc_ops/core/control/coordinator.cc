#include "control/coordinator.h"

#include <algorithm>
#include <cstdio>

#include "common/tensor_entry.h"
#include "control/fusion_planner.h"

namespace smdist {
namespace {

std::string Quote(const std::string& name) { return "'" + name + "'"; }

std::string FormatScale(double v, bool exact = false) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), exact ? "%.17g" : "%g", v);
  return buf;
}

// "pre/post" of two requests, with every digit where the short form would read the same.
std::pair<std::string, std::string> FormatScales(const Request& a, const Request& b) {
  auto text = [](const Request& r, bool exact) {
    return FormatScale(r.prescale, exact) + "/" + FormatScale(r.postscale, exact);
  };
  std::pair<std::string, std::string> out{text(a, false), text(b, false)};
  if (out.first == out.second) out = {text(a, true), text(b, true)};
  return out;
}

// "for tensor 'x' in allreduce: rank 0 has A, rank r has B"
std::string Mismatch(const char* what, const std::string& name, CollectiveType type, int first_rank, int r,
                     const std::string& a, const std::string& b) {
  return std::string("mismatched ") + what + " for tensor " + Quote(name) + " in " +
         CollectiveTypeName(type) + ": rank " + std::to_string(first_rank) + " has " + a + ", rank " +
         std::to_string(r) + " has " + b;
}

std::vector<int64_t> TrailingDims(const std::vector<int64_t>& shape) {
  return shape.empty() ? shape : std::vector<int64_t>(shape.begin() + 1, shape.end());
}

}  // namespace

std::string CheckAgreement(const std::string& name, const std::vector<Request>& submitted) {
  for (const Request& r : submitted) {
    if (!r.error.empty()) return "rank " + std::to_string(r.rank) + ": " + r.error;
  }
  const Request& first = submitted[0];
  const CollectiveType type = first.type;
  const bool same_first_dim =
      std::any_of(submitted.begin(), submitted.end(), [](const Request& r) { return r.same_first_dim; });
  for (size_t i = 1; i < submitted.size(); ++i) {
    const Request& r = submitted[i];
    auto mismatch = [&](const char* what, const std::string& a, const std::string& b) {
      return Mismatch(what, name, type, first.rank, r.rank, a, b);
    };
    if (r.type != type) {
      return "mismatched operations for tensor " + Quote(name) + ": rank " + std::to_string(first.rank) +
             " called " + CollectiveTypeName(type) + ", rank " + std::to_string(r.rank) + " called " +
             CollectiveTypeName(r.type);
    }
    if (type == CollectiveType::kBarrier) continue;
    if (r.device.is_cpu() != first.device.is_cpu()) {
      // A GPU on one rank and host memory on another share no transport.
      return mismatch("devices (CPU or GPU)", first.device.ToString(), r.device.ToString());
    }
    if (r.dtype != first.dtype) return mismatch("dtypes", DataTypeName(first.dtype), DataTypeName(r.dtype));
    if (r.shape.size() != first.shape.size()) {
      return mismatch("ranks (number of dimensions)",
                      std::to_string(first.shape.size()) + " " + ShapeToString(first.shape),
                      std::to_string(r.shape.size()) + " " + ShapeToString(r.shape));
    }
    const bool ragged_first_dim =
        type == CollectiveType::kAllgather || type == CollectiveType::kAlltoall;
    if (ragged_first_dim ? TrailingDims(r.shape) != TrailingDims(first.shape)
                         : r.shape != first.shape) {
      return mismatch(ragged_first_dim ? "shapes beyond the first dimension" : "shapes",
                      ShapeToString(first.shape), ShapeToString(r.shape));
    }
    if (ragged_first_dim && same_first_dim && r.shape != first.shape) {
      return mismatch("first dimensions (an XLA-compiled call fixes its output shape, so every rank must pass "
                      "the same shape)",
                      ShapeToString(first.shape), ShapeToString(r.shape));
    }
    if (type == CollectiveType::kAllreduce || type == CollectiveType::kReducescatter) {
      if (r.reduce_op != first.reduce_op) {
        return mismatch("reduce ops", ReduceOpName(first.reduce_op), ReduceOpName(r.reduce_op));
      }
      if (r.prescale != first.prescale || r.postscale != first.postscale) {
        const auto scales = FormatScales(first, r);
        return mismatch("prescale/postscale factors", scales.first, scales.second);
      }
      if (type == CollectiveType::kAllreduce && r.compression != first.compression) {
        return mismatch("compression", WireCompressionName(first.compression),
                        WireCompressionName(r.compression));
      }
    }
    if (type == CollectiveType::kBroadcast && r.root_rank != first.root_rank) {
      return mismatch("root ranks", std::to_string(first.root_rank), std::to_string(r.root_rank));
    }
  }
  return "";
}

std::string JoinConflict(const std::string& name, const Request& first, const std::vector<int32_t>& joined) {
  std::string ranks;
  for (int32_t r : joined) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const std::string what = std::string(CollectiveTypeName(first.type)) + " of tensor " + Quote(name);
  const std::string while_joined = " while rank(s) " + ranks + " have joined (smdist_tf.join())";
  switch (first.type) {
    case CollectiveType::kAlltoall:
    case CollectiveType::kReducescatter:
      return what + " cannot run" + while_joined +
             ": only allreduce, allgather, broadcast and barrier complete without a joined rank";
    case CollectiveType::kBroadcast:
      if (std::find(joined.begin(), joined.end(), first.root_rank) == joined.end()) return "";
      return what + " cannot run" + while_joined + ": its root rank " + std::to_string(first.root_rank) +
             " is one of them and has no tensor to send";
    case CollectiveType::kAllreduce:
      if (first.prescale == 1.0 || first.reduce_op == ReduceOp::kSum || first.reduce_op == ReduceOp::kAverage) {
        return "";
      }
      return what + " (" + ReduceOpName(first.reduce_op) + ") with prescale_factor " + FormatScale(first.prescale) +
             " cannot run" + while_joined + ": a joined rank contributes the reduction's identity, which the factor "
             "would change";
    default:
      return "";
  }
}

Coordinator::Coordinator(std::vector<int> members, const FusionPlanner* planner, StallInspector stall_inspector,
                         const ResponseCache* cache)
    : members_(std::move(members)),
      size_(static_cast<int>(members_.size())),
      planner_(planner),
      stall_inspector_(std::move(stall_inspector)),
      cache_(cache),
      joined_(size_, false) {}

void Coordinator::Add(const RequestList& list, int rank) {
  if (list.shutdown && !shutdown_) {
    shutdown_ = true;
    shutdown_rank_ = rank;
  }
  if (!list.failure.empty() && failed_rank_ < 0) {
    failed_rank_ = rank;
    failure_ = list.failure;
  }
  if (!list.relayed_stop.empty() && relayed_stop_.empty()) {
    relayed_stop_ = list.relayed_stop;
    relayed_failed_peer_ = list.relayed_failed_peer;
  }
  const auto now = std::chrono::steady_clock::now();
  for (const Request& req : list.requests) {
    if (req.type == CollectiveType::kJoin) {
      if (!joined_[rank]) ++joined_count_;
      joined_[rank] = true;
      last_joined_ = rank;
      continue;
    }
    if (!req.cached && cache_ != nullptr && cache_->Contains(req.name) && evicting_.insert(req.name).second) {
      evictions_.push_back(req.name);
    }
    Pending& p = table_[req.name];
    if (p.by_rank.empty()) {
      p.by_rank.resize(size_);
      p.seen.assign(size_, false);
      p.first_seen = now;
    }
    if (p.seen[rank]) continue;  // ranks reject duplicates locally; be safe
    p.seen[rank] = true;
    p.by_rank[rank] = req;
    if (++p.count == size_) ready_.push_back(req.name);
  }
}

bool Coordinator::CompleteWithJoined(const Pending& pending) const {
  for (int r = 0; r < size_; ++r) {
    if (!pending.seen[r] && !joined_[r]) return false;
  }
  return true;
}

void Coordinator::Unjoin(int rank) {
  if (!joined_[rank]) return;
  joined_[rank] = false;
  --joined_count_;
}

Response Coordinator::ResponseFor(const std::string& name, const Pending& pending) {
  Response resp;
  resp.names.push_back(name);
  std::vector<Request> submitted;
  for (int r = 0; r < size_; ++r) {
    if (pending.seen[r]) {
      submitted.push_back(pending.by_rank[r]);
    } else {
      resp.joined.push_back(r);
    }
  }
  std::string error = CheckAgreement(name, submitted);
  if (error.empty() && !resp.joined.empty()) error = JoinConflict(name, submitted[0], resp.joined);
  if (!error.empty()) {
    resp.response_type = ResponseType::kError;
    resp.error = error;
    resp.invalid_input = std::any_of(submitted.begin(), submitted.end(),
                                     [](const Request& r) { return !r.error.empty(); });
    for (int32_t r : resp.joined) Unjoin(r);
    return resp;
  }
  const Request& first = submitted[0];
  resp.type = first.type;
  if (!resp.joined.empty()) resp.params.push_back(first);
  if (first.type == CollectiveType::kAllgather) {
    for (int r = 0; r < size_; ++r) {
      const Request& req = pending.by_rank[r];
      resp.sizes.push_back(!pending.seen[r] ? 0 : req.shape.empty() ? 1 : req.shape[0]);
    }
  } else if (first.type == CollectiveType::kAlltoall) {
    for (const Request& r : pending.by_rank) {
      resp.sizes.insert(resp.sizes.end(), r.splits.begin(), r.splits.end());
    }
  }
  return resp;
}

ResponseList Coordinator::BuildResponses() {
  ResponseList out;
  out.evictions = std::move(evictions_);
  evictions_.clear();
  evicting_.clear();
  if (joined_count_ > 0) {
    // Collectives that waited only for ranks that have now joined.
    for (const auto& kv : table_) {
      if (kv.second.count < size_ && CompleteWithJoined(kv.second)) ready_.push_back(kv.first);
    }
  }
  std::unordered_map<std::string, Request> fusion_params;
  for (const std::string& name : ready_) {
    auto it = table_.find(name);
    Response resp = ResponseFor(name, it->second);
    if (resp.response_type == ResponseType::kCollective &&
        resp.type == CollectiveType::kAllreduce && resp.joined.empty()) {
      fusion_params[name] = std::move(it->second.by_rank[0]);
    }
    out.responses.push_back(std::move(resp));
    table_.erase(it);
  }
  ready_.clear();
  planner_->Fuse(&out.responses, [&fusion_params](const std::string& name) -> const Request& {
    return fusion_params.at(name);
  });
  if (joined_count_ == size_) {
    Response join;
    join.type = CollectiveType::kJoin;
    join.names.push_back(kJoinName);
    join.last_joined = last_joined_;
    out.responses.push_back(std::move(join));
    joined_.assign(size_, false);
    joined_count_ = 0;
  }

  const auto now = std::chrono::steady_clock::now();
  auto oldest = now;
  for (const auto& kv : table_) oldest = std::min(oldest, kv.second.first_seen);
  std::vector<PendingCollective> pending;
  if (stall_inspector_.MayAct(std::chrono::duration<double>(now - oldest).count())) {
    for (const auto& kv : table_) {
      pending.push_back({kv.first, kv.second.seen, members_,
                         std::chrono::duration<double>(now - kv.second.first_seen).count()});
    }
  }
  if (!pending.empty() && stall_inspector_.Inspect(pending, now)) {
    // Name every incomplete collective, not only the first past the deadline:
    // each rank should find the one it is blocked on in the message.
    out.shutdown = true;
    out.shutdown_error = stall_inspector_.ShutdownHeader();
    for (const PendingCollective& p : pending) out.shutdown_error += "\n  " + DescribeStall(p);
  }
  if (failed_rank_ >= 0) {
    // A failing rank is leaving: nothing it had pending can complete.
    out.shutdown = true;
    out.failed_peer = members_[failed_rank_];
    out.shutdown_error = failure_ + "; smdist_tf stopped on every rank";
  } else if (shutdown_) {
    out.shutdown = true;
    if (out.shutdown_error.empty() && !relayed_stop_.empty()) {
      out.shutdown_error = relayed_stop_;
      out.failed_peer = relayed_failed_peer_;
    } else if (out.shutdown_error.empty()) {
      out.shutdown_error = "smdist_tf was shut down (shutdown() called on rank " +
                           std::to_string(members_[shutdown_rank_]) + ")";
    }
  }
  return out;
}

}  // namespace smdist
