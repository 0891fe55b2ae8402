// One process set's collectives: its queue of submitted entries, its own
// negotiation (control/negotiator.h) and execution over its own transports,
// and the thread that runs its cycles. Streams never wait on each other: two
// sets' collectives run at the same time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "common/tensor_entry.h"
#include "control/parameter_tuner.h"
#include "control/tensor_queue.h"
#include "control/timeline.h"
#include "transports/registry.h"

namespace smdist {

class CollectiveStream {
 public:
  // `members`: the world ranks of the set, ascending (this rank among them).
  // `on_stop` runs on the stream's thread when it stops for any reason but a
  // requested shutdown (a failure, a peer's failure, a stall).
  // Entries are dropped instead of completed once `*exiting` is set.
  CollectiveStream(int32_t id, std::vector<int> members, std::unique_ptr<Transports> transports,
                   const EngineConfig& config, Timeline* timeline, const std::atomic<bool>* exiting,
                   std::function<void(const std::string& reason)> on_stop);
  ~CollectiveStream();  // after Join()
  CollectiveStream(const CollectiveStream&) = delete;
  CollectiveStream& operator=(const CollectiveStream&) = delete;

  void Start();
  // See Engine::Enqueue. Broadcast roots are world ranks; they must be members.
  Status Enqueue(std::vector<TensorEntry> entries, bool run_inline);
  // The stream stops with every member at the next negotiation; their
  // pending collectives fail. `failure` (may be empty) says why, to them all.
  void RequestShutdown(const std::string& failure = "");
  // Refuses new entries now and asks the members to stop; what is queued
  // fails with `reason` when they do (at the next negotiation), on every member.
  // `failed_peer`: the job rank whose failure stopped this rank's engine, or -1.
  void Abort(const std::string& reason, int failed_peer);
  // Waits for the thread to end; whether it did within `seconds` (< 0: forever).
  bool Join(double seconds = -1);

  int32_t id() const { return id_; }
  const std::vector<int>& members() const { return members_; }
  const Transports& transports() const { return *transports_; }
  const Topology& topology() const { return transports_->topology(); }
  bool running() const;
  // The peer whose failure stopped this stream, or -1.
  int failed_peer() const;
  // Whether this rank has collectives submitted here and not yet executed.
  bool HasInFlight() { return queue_.HasInFlight(); }
  // Tests: see Engine.
  std::vector<std::string> cached_names();
  uint64_t cycles_run() const { return cycles_run_.load(); }
  // With autotuning (set 0 only): the parameters in force now, and whether
  // tuning has finished. False when this stream does not tune.
  bool tuned_parameters(TunableParameters* out, bool* finished) const;
  std::vector<std::string> DescribeAllreducePlan(const std::vector<int64_t>& counts, DataType dtype,
                                                 WireCompression compression, double prescale);

 private:
  struct CycleState;
  void BackgroundLoop();
  // Runs one cycle; cycle_mu_ held. False once cycles have ended for good.
  bool RunCycleLocked();
  // One negotiation + execution cycle; false when the stream must stop.
  bool RunCycle(CycleState* state);
  // End of an autotuning sample: rank 0's next step, broadcast, taken up by every member.
  Status SyncTuning(CycleState* state);
  // Takes this rank's entries for `response` and runs it; false on a fatal error.
  bool Execute(CycleState* state, const Response& response, bool remember);
  // Fails everything queued (with the reason of an earlier Abort, if any);
  // `report`: call on_stop_ unless aborted before.
  void Stop(const std::string& reason, bool report);
  // The member index of world rank `rank`, or -1.
  int MemberIndex(int rank) const;

  const int32_t id_;
  const std::vector<int> members_;
  std::unique_ptr<Transports> transports_;
  const EngineConfig config_;
  Timeline* timeline_;
  const std::atomic<bool>* exiting_;
  std::function<void(const std::string&)> on_stop_;

  TensorQueue queue_;
  mutable std::mutex state_mu_;  // running_, stop_reason_, failure_, relayed_stop_, failed_peer_ vs Enqueue
  bool running_ = true;
  std::string stop_reason_;
  std::string failure_;  // sent with the shutdown request when set
  std::string relayed_stop_;  // Abort's reason, sent to the members with the shutdown request
  int failed_peer_ = -1;
  std::atomic<bool> shutdown_requested_{false};
  std::thread thread_;
  // Cycles run one at a time, on the stream's thread or an inline caller;
  // cycle_mu_ is taken before state_mu_ when both are needed.
  std::mutex cycle_mu_;
  std::unique_ptr<CycleState> cycle_state_;
  bool cycles_over_ = false;  // cycle_mu_
  std::atomic<uint64_t> cycles_run_{0};  // by any thread: the stream's thread skips idle rounds callers ran
  std::atomic<bool> loop_done_{false};
  std::atomic<int64_t> cycle_us_;  // the idle wait's start; autotuning moves it
  mutable std::mutex tuned_mu_;    // the three below, read by other threads
  bool tuning_ = false;
  bool tuning_finished_ = false;
  TunableParameters tuned_;
  // Longest wait of an idle stream thread between negotiation rounds.
  static constexpr int64_t kIdleWaitCapUs = 20 * 1000;
};

}  // namespace smdist
