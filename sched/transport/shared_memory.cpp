#include "sched/transport/shared_memory.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include <fmt/format.h>

namespace fp8wire::shm {

namespace {

constexpr const char* kPrefix = "fp8wire-";

uint64_t random64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) == static_cast<ssize_t>(sizeof v)) return v;
  // A kernel without getrandom (before 3.17): the same source through its device.
  if (FILE* f = std::fopen("/dev/urandom", "rb")) {
    const size_t got = std::fread(&v, sizeof v, 1, f);
    std::fclose(f);
    if (got == 1) return v;
  }
  // Unguessable no more, but still unique: the time and the address space's layout.
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (static_cast<uint64_t>(ts.tv_nsec) << 20) ^ static_cast<uint64_t>(ts.tv_sec) ^
         reinterpret_cast<uintptr_t>(&v);
}

// This process's token, drawn again in a forked child (whose objects are its own).
uint64_t process_token() {
  static std::mutex mu;
  static pid_t pid = 0;
  static uint64_t token = 0;
  std::lock_guard lock(mu);
  if (pid != getpid()) {
    pid = getpid();
    token = random64();
  }
  return token;
}

std::string own_prefix() { return fmt::format("{}{:016x}-", kPrefix, process_token()); }

std::string path_of(const char* directory, const char* name) { return fmt::format("{}{}", directory, name); }

// A name fp8wire made: "/fp8wire-" and then no further '/' (a handle's name is a peer's word).
bool valid_name(const char* name) {
  return name && name[0] == '/' && std::strncmp(name + 1, kPrefix, std::strlen(kPrefix)) == 0 &&
         std::strchr(name + 1, '/') == nullptr && std::strstr(name, "..") == nullptr;
}

flock first_byte(short type) {
  flock l{};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 1;
  return l;
}

std::string errno_text(const char* what, const std::string& path, int err) {
  return fmt::format("{} {} failed: {}", what, path, std::strerror(err));
}

Status map(int fd, size_t bytes, Segment* out, std::string* error, const std::string& path) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *error = errno_text("mapping", path, errno);
    return Status::failed;
  }
  out->base = p;
  out->bytes = bytes;
  out->fd = fd;
  return Status::ok;
}

}  // namespace

Status create(size_t bytes, Segment* out, std::string* error, const char* directory) {
  *out = Segment{};
  for (int attempt = 0; attempt < 4; ++attempt) {
    char name[sizeof out->name];
    std::snprintf(name, sizeof name, "/%s%016llx", own_prefix().c_str(),
                  static_cast<unsigned long long>(random64()));
    const std::string path = path_of(directory, name);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == EEXIST) continue;  // 2^-64 a time; or someone planted it: another name
    if (fd < 0) {
      const int err = errno;
      *error = errno_text("creating", path, err);
      return err == ENOSPC ? Status::no_room : Status::failed;
    }
    Status status = Status::ok;
    // The lock first: the sweep leaves a young object alone only for a few seconds.
    flock l = first_byte(F_WRLCK);
    if (fcntl(fd, F_SETLK, &l) != 0) {
      *error = errno_text("locking", path, errno);
      status = Status::failed;
    } else if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      *error = fmt::format("reserving {} bytes for {} failed: {}", bytes, path, std::strerror(err));
      status = err == ENOSPC || err == ENOMEM || err == EFBIG ? Status::no_room : Status::failed;
    } else {
      status = map(fd, bytes, out, error, path);
    }
    if (status != Status::ok) {
      ::unlink(path.c_str());
      ::close(fd);
      *out = Segment{};
      return status;
    }
    out->owner = true;
    std::snprintf(out->name, sizeof out->name, "%s", name);
    return Status::ok;
  }
  *error = fmt::format("creating an object in {}: every new name existed already", directory);
  return Status::failed;
}

Status open(const char* name, size_t bytes, Segment* out, std::string* error, const char* directory) {
  *out = Segment{};
  if (!valid_name(name)) {
    *error = fmt::format("a peer's window name '{}' is not one fp8wire makes", name ? name : "");
    return Status::failed;
  }
  const std::string path = path_of(directory, name);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *error = errno_text("opening", path, errno);
    return Status::failed;
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    *error = fmt::format("{} holds {} bytes where its owner's handle says {}: not mapped", path,
                         static_cast<long long>(st.st_size), bytes);
    ::close(fd);
    return Status::failed;
  }
  const Status status = map(fd, bytes, out, error, path);
  if (status != Status::ok) ::close(fd);
  return status;
}

void unlink(Segment& s, const char* directory) {
  if (!s.owner || !s.name[0]) return;
  ::unlink(path_of(directory, s.name).c_str());
  s.name[0] = 0;
}

void close(Segment& s, const char* directory) {
  if (s.base) munmap(s.base, s.bytes);
  unlink(s, directory);
  if (s.fd >= 0) ::close(s.fd);
  s = Segment{};
}

bool owner_gone(const Segment& s) {
  if (s.fd < 0) return false;  // no lock to ask: not known gone
  flock l = first_byte(F_WRLCK);
  if (fcntl(s.fd, F_GETLK, &l) != 0) return false;
  return l.l_type == F_UNLCK;
}

Swept sweep(const char* directory, double min_age_s) {
  Swept swept;
  DIR* dir = opendir(directory);
  if (!dir) return swept;
  const std::string mine = own_prefix();
  const uid_t me = geteuid();
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  while (const dirent* e = readdir(dir)) {
    const char* name = e->d_name;
    if (std::strncmp(name, kPrefix, std::strlen(kPrefix)) != 0 || std::strncmp(name, mine.c_str(), mine.size()) == 0)
      continue;
    // Read-only: another user's object (mode 0600) cannot be opened at all; ours only to ask its lock.
    const int fd = openat(dirfd(dir), name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st{};
    const bool candidate = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == me &&
                           static_cast<double>(now.tv_sec - st.st_ctim.tv_sec) >= min_age_s;
    flock l = first_byte(F_WRLCK);
    if (candidate && fcntl(fd, F_GETLK, &l) == 0 && l.l_type == F_UNLCK && unlinkat(dirfd(dir), name, 0) == 0) {
      ++swept.objects;
      swept.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    ::close(fd);  // this process holds no lock on another process's object: nothing is dropped
  }
  closedir(dir);
  return swept;
}

}  // namespace fp8wire::shm
