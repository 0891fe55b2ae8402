#include "transports/mpi/mpi_point_to_point.h"

#include <algorithm>
#include <climits>

#include "common/copy_bytes.h"
#include "common/logging.h"
#include "transports/mpi/mpi_types.h"
#include "transports/mpi/p2p_header.h"

namespace smdist {
namespace {

// Polling backoff while requests are outstanding: short enough to keep
// pipeline latency low, long enough not to steal a core from compute.
constexpr auto kMinBackoff = std::chrono::microseconds(10);
constexpr auto kMaxBackoff = std::chrono::microseconds(200);
// A receive that waits is the critical path: a pipeline stage blocked on its
// neighbour has nothing else to run. For this long after the last progress
// the thread polls, yielding its core to any runnable thread between polls,
// instead of sleeping (a sleep costs up to kMaxBackoff per message, each way).
constexpr auto kReceivePollWindow = std::chrono::milliseconds(20);

std::string Describe(int peer, int tag) {
  return "rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
}

// One MPI datatype covering `buffers` (absolute addresses, used with
// MPI_BOTTOM), so several tensors move as one message without packing.
Status MakeScatteredType(const std::vector<std::pair<const void*, int64_t>>& buffers,
                         MPI_Datatype* type) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> displacements;
  for (const auto& b : buffers) {
    if (b.second > INT_MAX) {
      return Status::InvalidArgument("point-to-point tensor larger than 2 GiB is not supported");
    }
    MPI_Aint address = 0;
    MPI_Get_address(b.first, &address);
    lengths.push_back(static_cast<int>(b.second));
    displacements.push_back(address);
  }
  SMDIST_RETURN_IF_ERROR(MpiError(
      MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(),
                               displacements.data(), MPI_BYTE, type),
      "MPI_Type_create_hindexed"));
  return MpiError(MPI_Type_commit(type), "MPI_Type_commit");
}

}  // namespace

Status MpiPointToPoint::Create(double warn_seconds, double abort_seconds,
                               std::unique_ptr<MpiPointToPoint>* out) {
  auto channel = std::make_unique<MpiPointToPoint>();
  SMDIST_RETURN_IF_ERROR(MpiError(MPI_Comm_dup(MPI_COMM_WORLD, &channel->comm_), "MPI_Comm_dup"));
  MPI_Comm_set_errhandler(channel->comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(channel->comm_, &channel->rank_);
  MPI_Comm_size(channel->comm_, &channel->size_);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(channel->comm_, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr) channel->max_tag_ = *tag_ub;
  channel->warn_seconds_ = warn_seconds;
  channel->abort_seconds_ = abort_seconds;
  channel->thread_ = std::thread(&MpiPointToPoint::ProgressLoop, channel.get());
  *out = std::move(channel);
  return Status::OK();
}

MpiPointToPoint::~MpiPointToPoint() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  const Status aborted = Status::Aborted("the point-to-point channel was shut down");
  for (SendMessage& m : new_sends_) {
    if (m.release) m.release();
  }
  for (RecvMessage& m : new_recvs_) m.done(aborted);
  for (auto& kv : unmatched_) {
    for (auto& r : kv.second) r->message.done(aborted);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Matched receives are already arriving; let them land before their
  // buffers are handed back, but never wait long at shutdown.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (!finalized && !active_recvs_.empty() && Clock::now() < deadline) TestActive();
  for (auto& r : active_recvs_) {
    if (!finalized && r->request != MPI_REQUEST_NULL) MPI_Request_free(&r->request);
    r->message.done(aborted);
  }
  for (auto& s : active_sends_) {
    if (!finalized && s->request != MPI_REQUEST_NULL) MPI_Request_free(&s->request);
    if (!finalized && s->type != MPI_DATATYPE_NULL) MPI_Type_free(&s->type);
    if (s->message.release) s->message.release();
  }
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiPointToPoint::Validate(int peer, int tag) const {
  if (peer < 0 || peer >= size_) {
    return Status::InvalidArgument("point-to-point peer " + std::to_string(peer) +
                                   " is not a rank (world size " + std::to_string(size_) + ")");
  }
  if (peer == rank_) return Status::InvalidArgument("a rank cannot send to or receive from itself");
  if (tag < 0 || tag > max_tag_) {
    return Status::InvalidArgument("point-to-point tag " + std::to_string(tag) +
                                   " outside [0, " + std::to_string(max_tag_) + "]");
  }
  return Status::OK();
}

Status MpiPointToPoint::Send(SendMessage message) {
  SMDIST_RETURN_IF_ERROR(Validate(message.peer, message.tag));
  if (message.data.size() != message.signature.size()) {
    return Status::InvalidArgument("point-to-point send: one buffer per tensor expected");
  }
  for (const TensorSignature& t : message.signature) {
    if (t.bytes() > INT_MAX) {
      return Status::InvalidArgument("point-to-point tensor larger than 2 GiB is not supported");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    if (stopping_) return Status::Aborted("the point-to-point channel was shut down");
    new_sends_.push_back(std::move(message));
  }
  wake_.notify_one();
  return Status::OK();
}

Status MpiPointToPoint::Recv(RecvMessage message) {
  SMDIST_RETURN_IF_ERROR(Validate(message.peer, message.tag));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    if (stopping_) return Status::Aborted("the point-to-point channel was shut down");
    new_recvs_.push_back(std::move(message));
  }
  wake_.notify_one();
  return Status::OK();
}

void MpiPointToPoint::Abort(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_.ok()) abort_ = status;
  }
  wake_.notify_all();
}

void MpiPointToPoint::ProgressLoop() {
  auto backoff = kMinBackoff;
  auto last_progress = Clock::now();
  for (;;) {
    std::deque<SendMessage> sends;
    std::deque<RecvMessage> recvs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool idle = active_sends_.empty() && active_recvs_.empty() && unmatched_.empty();
      if (idle) {
        wake_.wait(lock, [&] {
          return stopping_ || !abort_.ok() || !new_sends_.empty() || !new_recvs_.empty();
        });
      }
      if (stopping_) return;
      sends.swap(new_sends_);
      recvs.swap(new_recvs_);
      if (!abort_.ok() && broken_.ok()) {
        const Status reason = abort_;
        lock.unlock();
        for (SendMessage& m : sends) {
          if (m.release) m.release();
        }
        for (RecvMessage& m : recvs) m.done(reason);
        Fail(reason);  // unmatched receives fail; later calls see the reason
        continue;
      }
    }
    bool progressed = !sends.empty() || !recvs.empty();
    // Sends are posted in submission order: the signature cache depends on it.
    for (SendMessage& m : sends) {
      auto send = std::make_unique<PendingSend>();
      send->message = std::move(m);
      PostSend(std::move(send));
    }
    for (RecvMessage& m : recvs) {
      auto recv = std::make_unique<PendingRecv>();
      recv->since = Clock::now();
      const Key key(m.peer, m.tag);
      recv->message = std::move(m);
      unmatched_[key].push_back(std::move(recv));
    }
    progressed |= MatchReceives();
    progressed |= TestActive();
    CheckStalls();
    if (progressed) {
      backoff = kMinBackoff;
      last_progress = Clock::now();
    } else if ((!unmatched_.empty() || !active_recvs_.empty()) &&
               Clock::now() - last_progress < kReceivePollWindow) {
      std::this_thread::yield();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, backoff, [&] {
        return stopping_ || !abort_.ok() || !new_sends_.empty() || !new_recvs_.empty();
      });
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
}

bool MpiPointToPoint::PostSend(std::unique_ptr<PendingSend> send) {
  SendMessage& m = send->message;
  const Key key(m.peer, m.tag);
  auto cached = sent_signature_.find(key);
  int rc = MPI_SUCCESS;
  if (cached != sent_signature_.end() && cached->second == m.signature) {
    // Unchanged signature: raw bytes only, straight from the tensors.
    if (m.data.size() == 1) {
      rc = MPI_Isend(m.data[0], static_cast<int>(m.signature[0].bytes()), MPI_BYTE, m.peer, m.tag,
                     comm_, &send->request);
    } else {
      std::vector<std::pair<const void*, int64_t>> buffers;
      for (size_t i = 0; i < m.data.size(); ++i) buffers.emplace_back(m.data[i], m.signature[i].bytes());
      Status s = MakeScatteredType(buffers, &send->type);
      if (!s.ok()) {
        Fail(s);
        return true;
      }
      rc = MPI_Isend(MPI_BOTTOM, 1, send->type, m.peer, m.tag, comm_, &send->request);
    }
  } else {
    // New signature: header and payload in one message, so the receiver can
    // size its outputs. Its length never equals the previous payload length.
    const int64_t previous =
        cached == sent_signature_.end() ? -1 : PayloadBytes(cached->second);
    send->staging = EncodeP2pHeader(m.signature, previous);
    size_t at = send->staging.size();
    send->staging.resize(at + PayloadBytes(m.signature));
    for (size_t i = 0; i < m.data.size(); ++i) {
      const int64_t n = m.signature[i].bytes();
      if (n > 0) CopyBytes(send->staging.data() + at, m.data[i], n);
      at += n;
    }
    if (send->staging.size() > INT_MAX) {
      Fail(Status::InvalidArgument("point-to-point message larger than 2 GiB is not supported"));
      return true;
    }
    sent_signature_[key] = m.signature;
    // The tensors were copied: release them now.
    if (m.release) m.release();
    m.release = nullptr;
    rc = MPI_Isend(send->staging.data(), static_cast<int>(send->staging.size()), MPI_BYTE, m.peer,
                   m.tag, comm_, &send->request);
  }
  if (rc != MPI_SUCCESS) {
    Fail(MpiError(rc, ("MPI_Isend to " + Describe(m.peer, m.tag)).c_str()));
    if (m.release) m.release();
    return true;
  }
  active_sends_.push_back(std::move(send));
  return true;
}

bool MpiPointToPoint::MatchReceives() {
  bool progressed = false;
  for (auto it = unmatched_.begin(); it != unmatched_.end();) {
    const Key& key = it->first;
    auto& queue = it->second;
    // Only the oldest receive of a (peer, tag) may match: messages arrive in order.
    while (!queue.empty()) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      int rc = MPI_Improbe(key.first, key.second, comm_, &flag, &message, &status);
      if (rc != MPI_SUCCESS) {
        Fail(MpiError(rc, "MPI_Improbe"));
        return true;
      }
      if (!flag) break;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      std::unique_ptr<PendingRecv> recv = std::move(queue.front());
      queue.pop_front();
      progressed = true;
      if (!MatchOne(key, &recv, message, count)) return true;
    }
    it = queue.empty() ? unmatched_.erase(it) : std::next(it);
  }
  return progressed;
}

bool MpiPointToPoint::MatchOne(const Key& key, std::unique_ptr<PendingRecv>* pending,
                               MPI_Message message, int64_t count) {
  PendingRecv& recv = **pending;
  auto cached = received_signature_.find(key);
  if (cached != received_signature_.end() && PayloadBytes(cached->second) == count) {
    // Same signature as last time: receive straight into the outputs.
    std::vector<void*> outputs;
    recv.allocation_error = recv.message.allocate(cached->second, &outputs);
    if (recv.allocation_error.ok() && outputs.size() != cached->second.size()) {
      recv.allocation_error = Status::Unknown("point-to-point receive allocated the wrong outputs");
    }
    int rc = MPI_SUCCESS;
    if (!recv.allocation_error.ok() || outputs.size() != 1) {
      if (!recv.allocation_error.ok()) {
        recv.scratch.resize(std::max<int64_t>(count, 1));
        rc = MPI_Imrecv(recv.scratch.data(), static_cast<int>(count), MPI_BYTE, &message,
                        &recv.request);
      } else {
        std::vector<std::pair<const void*, int64_t>> buffers;
        for (size_t i = 0; i < outputs.size(); ++i) {
          buffers.emplace_back(outputs[i], cached->second[i].bytes());
        }
        MPI_Datatype type = MPI_DATATYPE_NULL;
        Status s = MakeScatteredType(buffers, &type);
        if (!s.ok()) {
          Fail(s);
          recv.message.done(s);
          return false;
        }
        rc = MPI_Imrecv(MPI_BOTTOM, 1, type, &message, &recv.request);
        MPI_Type_free(&type);  // freed once the receive no longer needs it
      }
    } else {
      rc = MPI_Imrecv(outputs[0], static_cast<int>(count), MPI_BYTE, &message, &recv.request);
    }
    if (rc != MPI_SUCCESS) {
      Fail(MpiError(rc, ("MPI_Imrecv from " + Describe(key.first, key.second)).c_str()));
      recv.message.done(MpiError(rc, "MPI_Imrecv"));
      return false;
    }
    active_recvs_.push_back(std::move(*pending));
    return true;
  }
  // A new signature: the header leads the message. Headers are rare (first
  // message, changed shapes), so this receive blocks the progress thread.
  std::vector<uint8_t> bytes(std::max<int64_t>(count, 1));
  int rc = MPI_Mrecv(bytes.data(), static_cast<int>(count), MPI_BYTE, &message, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    Status s = MpiError(rc, ("MPI_Mrecv from " + Describe(key.first, key.second)).c_str());
    Fail(s);
    recv.message.done(s);
    return false;
  }
  std::vector<TensorSignature> signature;
  int64_t header_bytes = 0;
  Status s = DecodeP2pHeader(bytes.data(), count, &signature, &header_bytes);
  if (!s.ok()) {
    Fail(s);
    recv.message.done(s);
    return false;
  }
  received_signature_[key] = signature;
  std::vector<void*> outputs;
  s = recv.message.allocate(signature, &outputs);
  if (s.ok() && outputs.size() != signature.size()) {
    s = Status::Unknown("point-to-point receive allocated the wrong outputs");
  }
  if (s.ok()) {
    int64_t at = header_bytes;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int64_t n = signature[i].bytes();
      if (n > 0) CopyBytes(outputs[i], bytes.data() + at, n);
      at += n;
    }
  }
  recv.message.done(s);
  return true;
}

bool MpiPointToPoint::TestActive() {
  bool progressed = false;
  for (size_t i = 0; i < active_sends_.size();) {
    PendingSend& send = *active_sends_[i];
    int flag = 0;
    int rc = MPI_Test(&send.request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      Fail(MpiError(rc, ("MPI_Isend to " + Describe(send.message.peer, send.message.tag)).c_str()));
      return true;
    }
    if (!flag) {
      ++i;
      continue;
    }
    if (send.type != MPI_DATATYPE_NULL) MPI_Type_free(&send.type);
    if (send.message.release) send.message.release();
    active_sends_.erase(active_sends_.begin() + i);
    progressed = true;
  }
  for (size_t i = 0; i < active_recvs_.size();) {
    PendingRecv& recv = *active_recvs_[i];
    int flag = 0;
    int rc = MPI_Test(&recv.request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      Status s = MpiError(rc, ("MPI_Imrecv from " + Describe(recv.message.peer, recv.message.tag)).c_str());
      std::unique_ptr<PendingRecv> failed = std::move(active_recvs_[i]);
      active_recvs_.erase(active_recvs_.begin() + i);
      failed->message.done(s);
      Fail(s);
      return true;
    }
    if (!flag) {
      ++i;
      continue;
    }
    std::unique_ptr<PendingRecv> finished = std::move(active_recvs_[i]);
    active_recvs_.erase(active_recvs_.begin() + i);
    finished->message.done(finished->allocation_error);
    progressed = true;
  }
  return progressed;
}

void MpiPointToPoint::CheckStalls() {
  const auto now = Clock::now();
  for (auto& kv : unmatched_) {
    auto& queue = kv.second;
    if (queue.empty()) continue;
    PendingRecv& oldest = *queue.front();
    const double waited = std::chrono::duration<double>(now - oldest.since).count();
    if (warn_seconds_ > 0 && waited >= warn_seconds_ && !oldest.warned) {
      oldest.warned = true;
      LogWarning("point-to-point receive from " + Describe(kv.first.first, kv.first.second) +
                 " has waited " + std::to_string(static_cast<int>(waited)) +
                 " s: is that rank still running the same schedule?");
    }
    if (abort_seconds_ > 0 && waited >= abort_seconds_) {
      const Status stalled = Status::Aborted(
          "point-to-point receive from " + Describe(kv.first.first, kv.first.second) +
          " stalled for more than " + std::to_string(static_cast<int>(abort_seconds_)) + " s");
      for (auto& r : queue) r->message.done(stalled);
      queue.clear();
    }
  }
}

void MpiPointToPoint::Fail(const Status& status) {
  // An abort is the engine stopping, which reports its own reason.
  if (status.code() != StatusCode::kAborted) LogError(status.message());
  std::deque<SendMessage> sends;
  std::deque<RecvMessage> recvs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = status;
    sends.swap(new_sends_);
    recvs.swap(new_recvs_);
  }
  for (SendMessage& m : sends) {
    if (m.release) m.release();
  }
  for (RecvMessage& m : recvs) m.done(status);
  for (auto& kv : unmatched_) {
    for (auto& r : kv.second) r->message.done(status);
  }
  unmatched_.clear();
}

}  // namespace smdist
