// runtime/core/backend_module.cpp: loading a backend module on first use
// (backend_module.hpp).  The module (libmodar_cuda.so) is looked for beside
// the file that holds this code (the `modar` program, or the Python module's
// _core*.so), in ../lib from there, beside the running program, and last
// where the build tree put it; MODAR_CUDA_MODULE names a file instead.  Its
// undefined symbols (the core's registry, the communicator's MPI world) bind
// to the loading program's, which exports them (--export-dynamic for
// programs; a Python extension is made global here first), so the module
// registers into the one registry there is.
#include "backend_module.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "modar/base/errors.hpp"

namespace modar::runtime::detail {

namespace {

struct ModuleFile {
  const char* backend;
  const char* file;        // file name, e.g. libmodar_cuda.so
  const char* build_path;  // where the build tree put it
  const char* env;         // environment variable naming the file instead
};

constexpr ModuleFile kModules[] = {
#ifdef MODAR_CUDA_MODULE_FILE
    {"cuda", MODAR_CUDA_MODULE_FILE, MODAR_CUDA_MODULE_BUILD_PATH, "MODAR_CUDA_MODULE"},
#endif
    {nullptr, nullptr, nullptr, nullptr},
};

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::string running_program() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

// The shared object holding this code (the Python extension), or "" when it
// is the program itself.
std::string host_shared_object() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_backend_module), &info) == 0 ||
      info.dli_fname == nullptr) {
    return {};
  }
  const std::string path = info.dli_fname;
  const std::string name =
      path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  return name.find(".so") != std::string::npos ? path : std::string();
}

std::vector<std::string> candidate_paths(const ModuleFile& module) {
  std::vector<std::string> paths;
  const auto add = [&paths](const std::string& path) {
    for (const std::string& known : paths) {
      if (known == path) {
        return;
      }
    }
    paths.push_back(path);
  };
  const std::string host = host_shared_object();
  const std::string program = running_program();
  for (const std::string& beside : {host, program}) {
    if (!beside.empty()) {
      add(directory_of(beside) + "/" + module.file);
      add(directory_of(beside) + "/../lib/" + module.file);
    }
  }
  add(module.build_path);
  return paths;
}

void load(const ModuleFile& module) {
  std::string path;
  if (const char* named = std::getenv(module.env); named != nullptr && *named != '\0') {
    path = named;
  } else {
    std::string looked;
    for (const std::string& candidate : candidate_paths(module)) {
      if (access(candidate.c_str(), F_OK) == 0) {
        path = candidate;
        break;
      }
      looked += (looked.empty() ? "" : ", ") + candidate;
    }
    if (path.empty()) {
      throw BackendError(std::string("backend = ") + module.backend + ": its module " +
                         module.file + " is not installed (looked in " + looked + "); set " +
                         module.env + " to its path");
    }
  }
  // A Python extension is loaded with RTLD_LOCAL: make its symbols (the core
  // the module binds to) global first.
  if (const std::string host = host_shared_object(); !host.empty()) {
    dlopen(host.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  }
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* why = dlerror();
    // The loader's reason names the file it could not open (the module, or
    // a library it needs such as libcublasLt.so.13).
    throw BackendError(std::string("backend = ") + module.backend + ": cannot load its module: " +
                       (why != nullptr ? why : path + ": unknown error"));
  }
}

}  // namespace

std::vector<std::string> module_backend_names() {
  std::vector<std::string> names;
  for (const ModuleFile& module : kModules) {
    if (module.backend != nullptr) {
      names.emplace_back(module.backend);
    }
  }
  return names;
}

bool load_backend_module(const std::string& name) {
  static std::mutex mutex;
  static std::vector<std::string> loaded;
  for (const ModuleFile& module : kModules) {
    if (module.backend == nullptr || name != module.backend) {
      continue;
    }
    const std::lock_guard<std::mutex> lock(mutex);
    for (const std::string& done : loaded) {
      if (done == name) {
        return true;
      }
    }
    load(module);
    loaded.push_back(name);
    return true;
  }
  return false;
}

}  // namespace modar::runtime::detail
