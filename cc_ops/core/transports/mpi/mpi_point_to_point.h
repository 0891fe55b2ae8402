// Point-to-point channel over MPI: its own duplicate of COMM_WORLD and its
// own progress thread, so pipeline traffic never waits behind (or mixes
// with) the collective engine's negotiation cycle. Needs MPI_THREAD_MULTIPLE
// because both threads call MPI.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "transports/point_to_point.h"

namespace smdist {

class MpiPointToPoint : public PointToPointChannel {
 public:
  // Collective over COMM_WORLD (duplicates it). A receive waiting longer than
  // `warn_seconds` logs a warning; longer than `abort_seconds` fails (<= 0: never).
  static Status Create(double warn_seconds, double abort_seconds,
                       std::unique_ptr<MpiPointToPoint>* out);
  MpiPointToPoint() = default;  // use Create(); public for std::make_unique
  ~MpiPointToPoint() override;

  Status Send(SendMessage message) override;
  Status Recv(RecvMessage message) override;
  void Abort(const Status& status) override;

 private:
  using Key = std::pair<int, int>;  // (peer, tag)
  using Clock = std::chrono::steady_clock;
  struct PendingSend {
    SendMessage message;
    std::vector<uint8_t> staging;  // header + payload when the header travels
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  struct PendingRecv {
    RecvMessage message;
    Clock::time_point since;
    bool warned = false;
    std::vector<uint8_t> scratch;  // drains a message whose allocation failed
    Status allocation_error;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  Status Validate(int peer, int tag) const;
  void ProgressLoop();
  // Each returns true when it made progress; a transport failure goes to Fail().
  bool PostSend(std::unique_ptr<PendingSend> send);
  bool MatchReceives();
  bool MatchOne(const Key& key, std::unique_ptr<PendingRecv>* recv, MPI_Message message,
                int64_t count);
  bool TestActive();
  void CheckStalls();
  void Fail(const Status& status);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = 32767;
  double warn_seconds_ = 0;
  double abort_seconds_ = 0;

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<SendMessage> new_sends_;
  std::deque<RecvMessage> new_recvs_;
  bool stopping_ = false;
  Status abort_;  // set by Abort(); the progress thread fails unmatched receives
  Status broken_;  // sticky: a transport failure fails every later call

  // Progress thread only.
  std::map<Key, std::vector<TensorSignature>> sent_signature_;
  std::map<Key, std::vector<TensorSignature>> received_signature_;
  std::map<Key, std::deque<std::unique_ptr<PendingRecv>>> unmatched_;
  std::vector<std::unique_ptr<PendingSend>> active_sends_;
  std::vector<std::unique_ptr<PendingRecv>> active_recvs_;
  std::thread thread_;
};

}  // namespace smdist
