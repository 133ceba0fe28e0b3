// POSIX shared memory for the direct transport's host windows (direct_memory_gpu.cpp registers it with
// CUDA), kept apart from CUDA so that the CPU tier tests it (tests/sched/test_shared_memory.cpp).
//   names      "/fp8wire-<process token>-<random>", 64 random bits each from getrandom: another user
//              cannot guess one to create it first (which would turn the creation into a fallback) or
//              to open it, and a leftover of a killed job never collides with a new one;
//   creation   O_CREAT | O_EXCL with mode 0600, the owner's lock taken at once, then the whole size
//              reserved (posix_fallocate): a shared-memory file system too small for the window fails
//              here, as "no room", instead of killing the process with SIGBUS at its first touch;
//   opening    the object's size (fstat) must be the size its handle gives, else it is not mapped;
//   the lock   the owner holds a write lock on the object's first byte (fcntl record lock) while the
//              segment lives: the kernel drops it when the process ends however it ends, it belongs to
//              the object rather than a pid (so it holds across PID namespaces and cannot be fooled by
//              a reused pid), and a forked child does not inherit it. A peer asks it (owner_gone), and
//              the sweep removes the names of segments no process holds. Closing any descriptor of an
//              object drops this process's lock on it, so a process opens each of its objects once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fp8wire::shm {

// Where the objects live: POSIX shared memory's file system on Linux (what shm_open uses).
inline constexpr const char* kDirectory = "/dev/shm";

// One object as this process maps it.
struct Segment {
  void* base = nullptr;
  size_t bytes = 0;
  int fd = -1;          // kept open: the owner's lock, a peer's question about it
  bool owner = false;
  char name[48] = {};   // "/fp8wire-..." while its name exists (the owner clears it when it unlinks)
};

enum class Status {
  ok,
  no_room,  // the file system could not reserve the size (ENOSPC: a small /dev/shm, a container's 64 MiB)
  failed,   // anything else, said in the error text
};

// A new object of `bytes` (whole pages: the caller rounds), zeroed, mapped read-write, its owner's
// lock held. `error` says what failed.
Status create(size_t bytes, Segment* out, std::string* error, const char* directory = kDirectory);
// A peer's object by the name and size its handle gives; refused when the name is not one of
// fp8wire's or the object's size differs from `bytes`.
Status open(const char* name, size_t bytes, Segment* out, std::string* error, const char* directory = kDirectory);
// Removes the name (once every peer holds the object): the memory goes with its last mapping.
void unlink(Segment& s, const char* directory = kDirectory);
// Unmaps and closes (the owner's lock goes with it); an owner's name not yet unlinked is removed.
void close(Segment& s, const char* directory = kDirectory);
// Whether no process holds the owner's lock on a peer's object any more (it ended or closed it).
bool owner_gone(const Segment& s);

// Removes the names of fp8wire's objects in `directory` that no process holds (their owner ended
// before it unlinked them: a killed job's leftovers), this user's only, and none younger than
// `min_age_s` seconds (an owner takes its lock right after creating the object; were it stopped in
// between and its name removed, its peers could not open it, and every rank would go over NCCL).
// Objects of this process are never touched. What was removed: objects and the bytes they held.
struct Swept {
  int objects = 0;
  uint64_t bytes = 0;
};
Swept sweep(const char* directory = kDirectory, double min_age_s = 2);

}  // namespace fp8wire::shm
