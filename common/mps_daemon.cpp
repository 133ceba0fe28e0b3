#include "common/mps_daemon.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

extern char** environ;

namespace fp8wire {

namespace {

constexpr const char* kControl = "nvidia-cuda-mps-control";

std::string find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Runs `program args...` with `extra` added to this process's environment and `input` on its stdin;
// returns its exit code (128 + signal, or -1 when it could not run).
int run_control(const std::string& program, const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& extra, const std::string& input) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& kv : extra) overridden |= kv.first == name;
    if (!overridden) env_strings.push_back(entry);
  }
  for (const auto& kv : extra) env_strings.push_back(kv.first + "=" + kv.second);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> all_args{program};
  all_args.insert(all_args.end(), args.begin(), args.end());
  for (auto& s : all_args) argv.push_back(s.data());
  argv.push_back(nullptr);

  int in[2];
  if (::pipe(in) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(in[0]);
    ::close(in[1]);
    return -1;
  }
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    ::close(in[0]);
    ::close(in[1]);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  for (size_t done = 0; done < input.size();) {
    const ssize_t n = ::write(in[1], input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(in[1]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string tail_of(const std::string& path, size_t bytes) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  std::string text = s.str();
  if (text.size() > bytes) text = text.substr(text.size() - bytes);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Removes the daemon's directory tree (its pipe and log folders). POSIX rather than
// std::filesystem: a launcher in a process that has loaded LibTorch (fp8wire-train) binds that
// library's exported copy of std::filesystem::remove_all, which crashed there.
void remove_tree(const std::string& dir) {
  // Children first; a file that cannot be removed leaves its folder behind, nothing worse.
  ::nftw(dir.c_str(), [](const char* path, const struct stat*, int, FTW*) { ::remove(path); return 0; }, 16,
         FTW_DEPTH | FTW_PHYS);
}

}  // namespace

PrivateMps::PrivateMps() {
  const char* opt = std::getenv("FP8WIRE_MPS");
  if (opt && std::string(opt) == "0") {
    why_ = "FP8WIRE_MPS=0";
    return;
  }
  if (opt && *opt && std::string(opt) != "1") {
    why_ = fmt::format("FP8WIRE_MPS='{}' is not 0 or 1; taken as 0", opt);
    return;
  }
  // An enclosing fp8wire launcher's daemon: join it (it stops it).
  const char* outer_mode = std::getenv("FP8WIRE_TESTBED_MODE");
  const char* outer_pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (outer_mode && outer_pipe && *outer_pipe && std::string(outer_mode) == kTestbedMps) {
    mode_ = kTestbedMps;
    pipe_dir_ = outer_pipe;
    if (const char* l = std::getenv("CUDA_MPS_LOG_DIRECTORY")) log_dir_ = l;
    why_ = "the enclosing launcher's daemon";
    return;
  }
  const std::string control = find_on_path(kControl);
  if (control.empty()) {
    why_ = fmt::format("{} not found on PATH", kControl);
    return;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = fmt::format("{}/fp8wire-mps-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!::mkdtemp(templ.data())) {
    why_ = fmt::format("cannot create a private directory for the MPS daemon under {}: {}", tmp && *tmp ? tmp : "/tmp",
                       std::strerror(errno));
    return;
  }
  dir_ = templ;
  pipe_dir_ = dir_ + "/pipe";
  log_dir_ = dir_ + "/log";
  ::mkdir(pipe_dir_.c_str(), 0700);
  ::mkdir(log_dir_.c_str(), 0700);
  const int rc = run_control(control, {"-d"}, {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir_}, {"CUDA_MPS_LOG_DIRECTORY", log_dir_}}, "");
  if (rc != 0) {
    const std::string log = tail_of(log_dir_ + "/control.log", 300);
    why_ = fmt::format("the private MPS daemon did not start ({} -d exited with {}{}{})", control, rc,
                       log.empty() ? "" : "; its log: ", log);
    remove_tree(dir_);
    dir_.clear();
    pipe_dir_.clear();
    log_dir_.clear();
    return;
  }
  owned_ = true;
  mode_ = kTestbedMps;
  why_ = fmt::format("pipe directory {}", pipe_dir_);
  control_ = control;
}

PrivateMps::~PrivateMps() { stop(); }

void PrivateMps::stop() {
  if (owned_) {
    owned_ = false;
    const int rc = run_control(control_, {}, {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir_}, {"CUDA_MPS_LOG_DIRECTORY", log_dir_}},
                               "quit\n");
    if (rc != 0)
      std::fprintf(stderr, "fp8wire launcher: stopping the private MPS daemon (%s) failed: exit %d\n", pipe_dir_.c_str(), rc);
  }
  if (!dir_.empty()) {
    remove_tree(dir_);
    dir_.clear();
  }
}

std::string PrivateMps::describe() const {
  if (side_by_side()) return fmt::format("ranks side by side under a private MPS daemon ({})", why_);
  return fmt::format("time-sliced ({})", why_);
}

std::vector<std::pair<std::string, std::string>> PrivateMps::rank_env() const {
  std::vector<std::pair<std::string, std::string>> env{{"FP8WIRE_TESTBED_MODE", mode_}};
  if (side_by_side()) {
    env.push_back({"CUDA_MPS_PIPE_DIRECTORY", pipe_dir_});
    if (!log_dir_.empty()) env.push_back({"CUDA_MPS_LOG_DIRECTORY", log_dir_});
  }
  return env;
}

}  // namespace fp8wire
