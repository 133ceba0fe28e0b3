// The direct transport's POSIX shared memory (sched/transport/shared_memory.hpp) on this machine's own
// file systems: names no one can guess or plant, objects only their user can open, the space reserved
// at creation (a file system too small says "no room" at once, and leaves nothing behind), the size
// checked on attach, the owner's lock seen gone when its process ends however it ends, and the sweep
// of a killed job's leftovers that touches nothing a live process, this process or another user holds.
// Runs in a private directory (and a 1 MiB tmpfs mounted for the "no room" case where the test may
// mount one; else /dev/shm asked for more than it has free).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "sched/transport/shared_memory.hpp"

using namespace fp8wire;
namespace fs = std::filesystem;

namespace {

// A private directory standing for /dev/shm, removed with everything in it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/fp8wire-shm-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.insert(e.path().filename().string());
    return out;
  }
};

// A child process that creates `count` objects in `dir`, reports their names through a pipe, and then
// waits to be killed (its objects never unlinked, as a killed job's are).
struct Creator {
  pid_t pid = -1;
  std::set<std::string> names;
  Creator(const std::string& dir, int count) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      for (int i = 0; i < count; ++i) {
        shm::Segment s;
        std::string error;
        if (shm::create(8192, &s, &error, dir.c_str()) != shm::Status::ok) _exit(2);
        std::string line = std::string(s.name + 1) + "\n";
        if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(3);
      }
      close(fds[1]);
      for (;;) pause();
    }
    close(fds[1]);
    std::string text;
    char buf[256];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) names.insert(text.substr(at, nl - at));
    REQUIRE(names.size() == static_cast<size_t>(count));
  }
  void kill_it() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Creator() { kill_it(); }
};

}  // namespace

TEST_CASE("shared memory: unguessable names, this user only, the name gone once unlinked") {
  TempDir dir;
  shm::Segment a, b;
  std::string error;
  REQUIRE(shm::create(8192, &a, &error, dir.path.c_str()) == shm::Status::ok);
  REQUIRE(shm::create(8192, &b, &error, dir.path.c_str()) == shm::Status::ok);
  const std::regex form("/fp8wire-[0-9a-f]{16}-[0-9a-f]{16}");
  CHECK(std::regex_match(a.name, form));
  CHECK(std::regex_match(b.name, form));
  CHECK(std::string(a.name) != b.name);
  // The process part is the same for both, the rest random.
  CHECK(std::string(a.name).substr(0, 26) == std::string(b.name).substr(0, 26));
  struct stat st{};
  REQUIRE(stat((dir.path + a.name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_size == 8192);
  CHECK(dir.names().size() == 2);
  shm::unlink(a, dir.path.c_str());
  CHECK(a.name[0] == 0);
  CHECK(dir.names().size() == 1);
  shm::close(a, dir.path.c_str());
  shm::close(b, dir.path.c_str());  // not unlinked before: close removes its name
  CHECK(dir.names().empty());
}

TEST_CASE("shared memory: a peer maps an object only by a name fp8wire makes and at the size its handle gives") {
  TempDir dir;
  shm::Segment own;
  std::string error;
  REQUIRE(shm::create(3 * 4096, &own, &error, dir.path.c_str()) == shm::Status::ok);
  std::memcpy(own.base, "window", 7);
  shm::Segment peer;
  CHECK(shm::open(own.name, 4096, &peer, &error, dir.path.c_str()) == shm::Status::failed);
  CHECK(error.find("12288 bytes where its owner's handle says 4096") != std::string::npos);
  CHECK(peer.base == nullptr);
  CHECK(shm::open(own.name, 5 * 4096, &peer, &error, dir.path.c_str()) == shm::Status::failed);
  for (const char* bad : {"/etc/passwd", "/fp8wire-../x", "fp8wire-abc", "/other-name", "/fp8wire-a/b"}) {
    CHECK(shm::open(bad, 4096, &peer, &error, dir.path.c_str()) == shm::Status::failed);
    CHECK(error.find("not one fp8wire makes") != std::string::npos);
  }
  REQUIRE(shm::open(own.name, 3 * 4096, &peer, &error, dir.path.c_str()) == shm::Status::ok);
  CHECK(std::strcmp(static_cast<const char*>(peer.base), "window") == 0);
  CHECK_FALSE(peer.owner);  // (its owner's lock is this process's own: record locks tell only other processes')
  shm::close(peer, dir.path.c_str());
  shm::close(own, dir.path.c_str());
  CHECK(dir.names().empty());
}

namespace {

// A 1 MiB tmpfs mounted for the test where it may mount one (root in a container that allows it).
struct SmallTmpfs {
  std::string path;
  bool mounted = false;
  explicit SmallTmpfs(const std::string& at) : path(at) {
    fs::create_directory(path);
    mounted = mount("tmpfs", path.c_str(), "tmpfs", 0, "size=1m") == 0;
  }
  ~SmallTmpfs() {
    if (mounted) umount(path.c_str());
  }
};

// The names in `dir` that this process made (its token: the first 26 characters of any of its names).
std::set<std::string> own_names(const std::string& dir, const std::string& token) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(token, 0) == 0) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("shared memory: a file system without room for the object says so at creation and keeps nothing") {
  TempDir dir;
  shm::Segment probe;
  std::string error;
  REQUIRE(shm::create(4096, &probe, &error, dir.path.c_str()) == shm::Status::ok);
  const std::string token = std::string(probe.name + 1).substr(0, 25);
  shm::close(probe, dir.path.c_str());
  SmallTmpfs small(dir.path + "/tmpfs");
  const std::string where = small.mounted ? small.path : std::string(shm::kDirectory);
  size_t too_big = size_t{2} << 20;  // in the 1 MiB tmpfs
  if (!small.mounted) {
    struct statvfs v{};
    REQUIRE(statvfs(shm::kDirectory, &v) == 0);
    too_big = static_cast<size_t>(v.f_bavail) * v.f_frsize + (size_t{1} << 30);
    MESSAGE("no tmpfs could be mounted here: /dev/shm asked for more than it has free");
  }
  INFO("in ", where);
  shm::Segment s;
  CHECK(shm::create(too_big, &s, &error, where.c_str()) == shm::Status::no_room);
  CHECK(error.find("No space left on device") != std::string::npos);
  CHECK(s.base == nullptr);
  CHECK(own_names(where, token).empty());
  if (small.mounted) {
    // What fits still works there.
    REQUIRE(shm::create(256 << 10, &s, &error, where.c_str()) == shm::Status::ok);
    shm::close(s, where.c_str());
  }
}

TEST_CASE("shared memory: the owner is seen gone when its process is killed") {
  TempDir dir;
  Creator owner(dir.path, 1);
  shm::Segment peer;
  std::string error;
  const std::string name = "/" + *owner.names.begin();
  REQUIRE(shm::open(name.c_str(), 8192, &peer, &error, dir.path.c_str()) == shm::Status::ok);
  CHECK_FALSE(shm::owner_gone(peer));
  owner.kill_it();
  CHECK(shm::owner_gone(peer));
  shm::close(peer, dir.path.c_str());
}

TEST_CASE("shared memory: the sweep removes a killed job's leftovers, and nothing anyone still holds") {
  TempDir dir;
  shm::Segment mine;
  std::string error;
  REQUIRE(shm::create(8192, &mine, &error, dir.path.c_str()) == shm::Status::ok);
  Creator killed(dir.path, 2), alive(dir.path, 1);
  killed.kill_it();
  CHECK(dir.names().size() == 4);
  // Young objects are left alone (an owner may not have taken its lock yet).
  CHECK(shm::sweep(dir.path.c_str()).objects == 0);
  const shm::Swept swept = shm::sweep(dir.path.c_str(), 0);
  CHECK(swept.objects == 2);
  CHECK(swept.bytes >= 2 * 8192);
  std::set<std::string> left = dir.names();
  CHECK(left.count(std::string(mine.name + 1)) == 1);  // this process's own
  CHECK(left.count(*alive.names.begin()) == 1);        // a live process's
  for (const std::string& n : killed.names) CHECK(left.count(n) == 0);
  alive.kill_it();
  CHECK(shm::sweep(dir.path.c_str(), 0).objects == 1);
  // Another user's object, held by no one, is not this process's to remove (root can tell).
  if (geteuid() == 0) {
    const std::string other = dir.path + "/fp8wire-0000000000000000-0000000000000001";
    const int fd = ::open(other.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(fchown(fd, 65534, 65534) == 0);
    close(fd);
    CHECK(shm::sweep(dir.path.c_str(), 0).objects == 0);
    CHECK(fs::exists(other));
  }
  // Names that are not fp8wire's are never looked at.
  { const int fd = ::open((dir.path + "/other").c_str(), O_CREAT | O_RDWR, 0600); close(fd); }
  CHECK(shm::sweep(dir.path.c_str(), 0).objects == 0);
  CHECK(fs::exists(dir.path + "/other"));
  shm::close(mine, dir.path.c_str());
}
