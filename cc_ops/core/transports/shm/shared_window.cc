#include "transports/shm/shared_window.h"

#include "transports/mpi/mpi_types.h"

namespace smdist {

Status SharedWindow::Create(MPI_Comm local, int64_t bytes, std::unique_ptr<SharedWindow>* out) {
  auto w = std::make_unique<SharedWindow>();
  w->local_ = local;
  int size = 0;
  MPI_Comm_size(local, &size);
  void* base = nullptr;
  int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, MPI_INFO_NULL, local, &base, &w->window_);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Win_allocate_shared");
  w->parts_.resize(size);
  for (int r = 0; r < size; ++r) {
    MPI_Aint part_size = 0;
    int disp = 0;
    rc = MPI_Win_shared_query(w->window_, r, &part_size, &disp, &w->parts_[r]);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Win_shared_query");
  }
  // Passive-target epoch for the window's lifetime; MPI_Win_sync orders memory.
  MPI_Win_lock_all(MPI_MODE_NOCHECK, w->window_);
  *out = std::move(w);
  return Status::OK();
}

SharedWindow::~SharedWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || window_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);
}

Status SharedWindow::Barrier() {
  MPI_Win_sync(window_);
  int rc = MPI_Barrier(local_);
  MPI_Win_sync(window_);
  return MpiError(rc, "MPI_Barrier(local)");
}

}  // namespace smdist
