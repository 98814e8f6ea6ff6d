// A flight-recorder dump that needs no Python: a thread of its own, parked on a FIFO.
//
// PyTorch's `_dump_fr_trace` binding must take the GIL before it can release it, so a rank
// whose main thread holds the GIL in a long C call (or a Python thread that never yields it)
// cannot dump through it. The recorder itself is C++: `c10d::dump_fr_trace` walks the ring
// buffer and pickles it without touching Python when no stack traces are asked for. This
// thread calls it directly whenever a byte arrives on its FIFO (the node's agent writes one
// for each `fr.dump`), writes the dump and then a sidecar prepared in advance, each through a
// temporary file and a rename, so a reader never sees half of either.
//
// Built at first use by trainer_hooks/fr_native.py (no torch headers: the function is found in
// the process's libtorch_cpu with dlsym, so nothing links against one torch build).

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

namespace {

using DumpFn = std::string (*)(bool include_collectives, bool include_stack_traces,
                               bool only_active);

// c10d::dump_fr_trace[abi:cxx11](bool, bool, bool)
constexpr const char* kDumpSymbol = "_ZN4c10d13dump_fr_traceB5cxx11Ebbb";
constexpr char kQuit = 'q';  // any other byte asks for a dump
constexpr std::chrono::seconds kMinInterval{1};

struct Target {
  std::string fifo;
  std::string dump_path;
  std::string sidecar_path;
  std::string sidecar;  // written after the dump: its presence says the dump is whole
  DumpFn dump;
};

bool write_all(int fd, const std::string& data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

bool replace_file(const std::string& path, const std::string& data) {
  std::string tmp = path;
  size_t slash = tmp.rfind('/');
  tmp.insert(slash == std::string::npos ? 0 : slash + 1, ".");
  tmp += ".native" + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, data);
  ok = (close(fd) == 0) && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

void serve(Target t) {
  auto last = std::chrono::steady_clock::time_point{};
  for (;;) {
    int fd = open(t.fifo.c_str(), O_RDONLY | O_CLOEXEC);  // waits for a writer
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // the FIFO is gone: the hooks closed
    }
    char buf[64];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) != 0) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (std::string(buf, static_cast<size_t>(n)).find(kQuit) != std::string::npos) {
        close(fd);
        return;  // the hooks closed: the next generation has a thread of its own
      }
      // One dump for however many requests arrived together, and at most one a second: the
      // FIFO is writable by the node's agent, which may run as another user, so by others too.
      auto now = std::chrono::steady_clock::now();
      if (now - last < kMinInterval) continue;
      last = now;
      std::string dump = t.dump(true, false, false);
      if (replace_file(t.dump_path, dump)) replace_file(t.sidecar_path, t.sidecar);
    }
    close(fd);
  }
}

}  // namespace

// 0: the thread runs; -1: no libtorch_cpu in this process; -2: it has no dump_fr_trace.
extern "C" int sentinel_fr_native_start(const char* fifo, const char* dump_path,
                                        const char* sidecar_path, const char* sidecar) {
  void* torch = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  if (torch == nullptr) return -1;
  auto dump = reinterpret_cast<DumpFn>(dlsym(torch, kDumpSymbol));
  if (dump == nullptr) return -2;
  std::thread(serve, Target{fifo, dump_path, sidecar_path, sidecar, dump}).detach();
  return 0;
}
