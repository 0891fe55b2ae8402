#include "engine_calls.h"

#include <pybind11/pybind11.h>

#include <future>
#include <memory>

#include "engine.h"

namespace py = pybind11;

namespace smdist_python {

smdist::Status RunToCompletion(std::vector<smdist::TensorEntry> entries) {
  std::vector<std::future<smdist::Status>> results;
  for (smdist::TensorEntry& e : entries) {
    auto finished = std::make_shared<std::promise<smdist::Status>>();
    results.push_back(finished->get_future());
    e.done = [finished](const smdist::Status& s) { finished->set_value(s); };
  }
  py::gil_scoped_release release;
  smdist::Status s = smdist::Engine::Instance().Enqueue(std::move(entries), /*run_inline=*/true);
  if (!s.ok()) return s;
  smdist::Status first;
  for (auto& r : results) {
    smdist::Status one = r.get();
    if (first.ok()) first = one;
  }
  return first;
}

}  // namespace smdist_python
