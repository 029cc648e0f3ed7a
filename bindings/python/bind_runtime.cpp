// bindings/python/bind_runtime.cpp -- the reference runtime: profiler and
// validation (include/modar/runtime/{profiler,validate}.hpp), when present.
#include "bindings.hpp"

namespace modar::python {

void bind_runtime(py::module_& m) {
    m.attr("has_runtime") = false;
}

}  // namespace modar::python
