// The process-wide collective engine: owns the transports, the queue of
// submitted collectives and the background thread that negotiates and runs
// them. Framework kernels only call Enqueue(); Python controls the lifetime.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/shared_output_arena.h"
#include "common/status.h"
#include "common/tensor_entry.h"
#include "control/tensor_queue.h"
#include "control/timeline.h"
#include "transports/point_to_point.h"
#include "transports/registry.h"

namespace smdist {

class Engine {
 public:
  static Engine& Instance();
  ~Engine();

  // Collective over all processes. Idempotent while running; restarts an
  // engine that another rank or a stall stopped.
  Status Init();
  // Stops the engine on every rank (the others learn it in the next cycle);
  // pending collectives fail. Init() may be called again afterwards.
  Status Shutdown();
  // Called by exit() (after Python's own exit handlers) with the exit status.
  // Status 0: shut down with every rank and finish the communication runtime,
  // which waits for the peers to finish. Otherwise this rank failed: it tells the peers why (so
  // their collectives fail at once, naming it) and leaves without waiting for
  // them, keeping its status; a launcher then stops the job.
  void AtProcessExit(int status);
  // The rank whose failure stopped this engine, or -1 (tells a rank that
  // fails afterwards it is not the cause).
  int failed_peer() const;
  // Stops the engine on every rank because this one failed: the others'
  // collectives fail with `failure`. Waits at most `wait_seconds` for the
  // announcement to go out; returns whether it did.
  bool AnnounceFailure(const std::string& failure, double wait_seconds);

  bool initialized() const { return initialized_.load(); }
  Topology topology() const;
  std::string intra_host_allreduce() const;
  // Whether the communication runtime lets several threads call it at once
  // (MPI_THREAD_MULTIPLE): point-to-point messages need it.
  bool runtime_threads_multiple() const { return runtime_threads_multiple_; }
  // Whether smdist_tf started the communication runtime; otherwise its owner
  // finishes it, perhaps before exit() runs AtProcessExit.
  bool owns_runtime() const;
  EngineConfig config() const;

  // Chrome-trace timeline of this rank (SMDIST_TIMELINE opens one at init),
  // with an instant event per cycle that ran collectives when `mark_cycles`.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline() { timeline_.Stop(); }

  // Queues entries submitted together (they are negotiated in the same
  // cycle, so a group fuses). On error nothing is queued and no done runs.
  // With `run_inline`, a caller that finds no cycle running runs one itself
  // instead of waking the engine thread: a lone collective then completes
  // without two thread hand-offs (done may run before Enqueue returns).
  Status Enqueue(std::vector<TensorEntry> entries, bool run_inline = false);

  // Point-to-point messages (pipeline parallelism). They bypass negotiation:
  // both ends name each other, and a send never waits for its receiver.
  Status Send(SendMessage message);
  Status Recv(RecvMessage message);

  // Memory for an allreduce output that this host's peers can store into
  // directly (SharedOutputArena), or null: no arena, not running, or full.
  // Any thread; the block may outlive the engine.
  std::unique_ptr<SharedOutputBlock> AllocateSharedOutput(int64_t bytes);
  int64_t shared_output_bytes_in_use() const;
  // The response cache's names, most recently executed first (tests).
  std::vector<std::string> cached_names();
  // How an allreduce of host tensors of these element counts would run here
  // now: one "<transport> in_place|packed <member>,..." line per step of the
  // fusion planner's plan (tests). Empty when not running.
  std::vector<std::string> DescribeAllreducePlan(const std::vector<int64_t>& counts, DataType dtype,
                                                 WireCompression compression, double prescale);

 private:
  // Why a send/recv cannot be taken now, or OK; state_mu_ held.
  Status PointToPointReadyLocked() const;
  Engine() = default;
  // Stops the thread and frees the transports; lifecycle_mu_ held.
  void ReleaseLocked();
  struct CycleState;
  void BackgroundLoop();
  // Runs one cycle; cycle_mu_ held. False once cycles have ended for good.
  bool RunCycleLocked();
  // One negotiation + execution cycle; false when the engine must stop.
  bool RunCycle(CycleState* state);
  // Bit-vector round for cached collectives: fills `ready` with the cached
  // collectives every rank has submitted; `needs_full` when anyone has
  // uncached work, asked to shut down, or suspects a stall.
  Status NegotiateCached(CycleState* state, std::vector<Request>* uncached,
                         std::vector<Response>* ready, bool* needs_full);
  Status NegotiateFull(CycleState* state, std::vector<Request> uncached, ResponseList* out);
  // Takes this rank's entries for `response` and runs it; false on a fatal error.
  bool Execute(CycleState* state, const Response& response, bool remember);
  void Stop(const std::string& reason);

  mutable std::mutex lifecycle_mu_;  // Init/Shutdown
  mutable std::mutex state_mu_;      // running_/stop_reason_ vs Enqueue
  std::atomic<bool> initialized_{false};
  bool running_ = false;
  std::string stop_reason_;
  std::atomic<bool> shutdown_requested_{false};
  std::string exit_failure_;  // state_mu_: sent with the shutdown request when set
  int failed_peer_ = -1;      // state_mu_
  std::atomic<bool> loop_done_{false};
  // At process exit the framework may be half torn down: pending entries are
  // dropped instead of completed.
  std::atomic<bool> exiting_{false};
  bool runtime_threads_multiple_ = false;

  EngineConfig config_;
  std::unique_ptr<Transports> transports_;
  std::unique_ptr<TensorQueue> queue_;
  PointToPointChannel* p2p_ = nullptr;  // transports_'s; null without runtime_threads_multiple_
  mutable std::mutex arena_mu_;  // output_arena_ vs kernels on TensorFlow's threads
  std::shared_ptr<SharedOutputArena> output_arena_;
  std::thread thread_;
  Timeline timeline_;
  // Cycles run one at a time, on the engine thread or an inline caller;
  // cycle_mu_ is taken before state_mu_ when both are needed.
  std::mutex cycle_mu_;
  std::unique_ptr<CycleState> cycle_state_;
  bool cycles_over_ = false;  // cycle_mu_
  std::atomic<uint64_t> cycles_run_{0};  // by any thread: the engine thread skips idle rounds callers ran
  // Longest wait of an idle engine thread between negotiation rounds.
  static constexpr int64_t kIdleWaitCapUs = 20 * 1000;
};

}  // namespace smdist
