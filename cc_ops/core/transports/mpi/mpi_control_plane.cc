#include "transports/mpi/mpi_control_plane.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "transports/mpi/mpi_collectives.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {

namespace {

// Peers that are there answer a negotiation round within microseconds, and
// one a little behind within a millisecond.
constexpr auto kPollWithoutSleep = std::chrono::milliseconds(1);
// Bounds what a sleep adds to a round once the late peer arrives.
constexpr auto kLongestSleep = std::chrono::microseconds(250);

// Waits for a negotiation round without holding a core. A peer may be seconds
// behind (its step still computing, or its rank descheduled where ranks
// outnumber cores), and MPI's blocking calls poll all that time, taking the
// core from the ranks still computing. Polls for a short while (yielding, so a
// peer that shares the core runs), then sleeps ever longer between polls.
Status WaitSparingTheCore(MPI_Request* request, const char* what) {
  const auto poll_until = std::chrono::steady_clock::now() + kPollWithoutSleep;
  auto sleep = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(rc, what);
    if (done) return Status::OK();
    if (std::chrono::steady_clock::now() < poll_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    }
  }
}

}  // namespace

Status MpiControlPlane::GatherToRoot(const std::vector<uint8_t>& mine,
                                     std::vector<std::vector<uint8_t>>* gathered) {
  const Topology& topo = comms_->topology();
  const int n = topo.size;
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(topo.rank == 0 ? n : 0);
  // The root waits here for the last rank to reach this round; the payload follows at once.
  MPI_Request request;
  int rc = MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comms_->world(), &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Igather");
  SMDIST_RETURN_IF_ERROR(WaitSparingTheCore(&request, "MPI_Igather"));
  std::vector<int> displs;
  std::vector<uint8_t> all;
  if (topo.rank == 0) {
    displs.resize(n);
    int total = 0;
    for (int r = 0; r < n; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(total);
  }
  rc = MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                   MPI_BYTE, 0, comms_->world());
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gatherv");
  if (topo.rank == 0) {
    gathered->assign(n, {});
    for (int r = 0; r < n; ++r) {
      (*gathered)[r].assign(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    }
  }
  return Status::OK();
}

Status MpiControlPlane::BroadcastFromRoot(std::vector<uint8_t>* bytes) {
  // The other ranks wait here for the root's answer; the payload follows at once.
  int64_t size = static_cast<int64_t>(bytes->size());
  MPI_Request request;
  const int rc = MPI_Ibcast(&size, 1, MPI_INT64_T, 0, comms_->world(), &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Ibcast");
  SMDIST_RETURN_IF_ERROR(WaitSparingTheCore(&request, "MPI_Ibcast"));
  bytes->resize(size);
  return MpiBroadcast(comms_->world(), bytes->data(), size, DataType::kUInt8, 0);
}

Status MpiControlPlane::AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) {
  MPI_Request request;
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, words->data(), static_cast<int>(words->size()), MPI_UINT64_T,
                                bitwise_and ? MPI_BAND : MPI_BOR, comms_->world(), &request);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Iallreduce(bits)");
  return WaitSparingTheCore(&request, "MPI_Iallreduce(bits)");
}

}  // namespace smdist
