// A stand-in libnccl.so.2 for the shim tests: every function records its name and arguments and
// returns ncclSuccess, so a test can check that libfp8wire.so forwarded each argument exactly.
// Extra C functions (fake_nccl_*) let the test read the record and change the fake's answers.
#include <nccl.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include <fmt/format.h>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mutex;
std::string g_log;
bool g_recording = true;
int g_comm_count = 2;
int g_user_rank = 0;
bool g_reenter = false;  // ncclAllReduce calls the process's ncclAllReduce once more, as NCCL's
                         // legacy entry points call its public API
thread_local int t_depth = 0;
uintptr_t g_next_comm = 0xc0c00001;

template <class... Args>
void record(fmt::format_string<Args...> format, Args&&... args) {
  std::lock_guard lock(g_mutex);
  if (!g_recording) return;
  g_log += fmt::format(format, std::forward<Args>(args)...);
  g_log += '\n';
}

ncclComm_t new_comm() {
  std::lock_guard lock(g_mutex);
  return reinterpret_cast<ncclComm_t>(g_next_comm++);
}

const void* p(const void* ptr) { return ptr; }

std::string id_text(const ncclUniqueId& id) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += fmt::format("{:02x}", static_cast<unsigned char>(id.internal[i]));
  return out;
}

}  // namespace

// --- test controls -----------------------------------------------------------------------------

FAKE_EXPORT const char* fake_nccl_log() {
  static std::string copy;
  std::lock_guard lock(g_mutex);
  copy = g_log;
  return copy.c_str();
}
FAKE_EXPORT void fake_nccl_reset() {
  std::lock_guard lock(g_mutex);
  g_log.clear();
}
FAKE_EXPORT void fake_nccl_configure(int comm_count, int user_rank, int reenter, int recording) {
  std::lock_guard lock(g_mutex);
  g_comm_count = comm_count;
  g_user_rank = user_rank;
  g_reenter = reenter != 0;
  g_recording = recording != 0;
}

// --- NCCL API ----------------------------------------------------------------------------------

FAKE_EXPORT ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id->internal[i] = static_cast<char>(i + 1);
  return ncclSuccess;
}
FAKE_EXPORT const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL error"; }
FAKE_EXPORT const char* ncclGetLastError(ncclComm_t) { return ""; }

FAKE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  *comm = new_comm();
  record("ncclCommInitRank(nranks={}, id={}, rank={}) -> {}", nranks, id_text(id), rank, p(*comm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                                ncclConfig_t* config) {
  *comm = new_comm();
  record("ncclCommInitRankConfig(nranks={}, id={}, rank={}, config={}) -> {}", nranks, id_text(id), rank,
         p(config), p(*comm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  std::string devs, out;
  for (int i = 0; i < ndev; ++i) {
    comms[i] = new_comm();
    devs += fmt::format("{}{}", i ? "," : "", devlist[i]);
    out += fmt::format("{}{}", i ? "," : "", p(comms[i]));
  }
  record("ncclCommInitAll(ndev={}, devlist=[{}]) -> [{}]", ndev, devs, out);
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int myrank, int nId,
                                                  ncclUniqueId* ids, ncclConfig_t* config) {
  *comm = new_comm();
  std::string id_list;
  for (int i = 0; i < nId; ++i) id_list += (i ? "," : "") + id_text(ids[i]);
  record("ncclCommInitRankScalable(nranks={}, myrank={}, nId={}, ids=[{}], config={}) -> {}", nranks, myrank,
         nId, id_list, p(config), p(*comm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  *newcomm = new_comm();
  record("ncclCommSplit(comm={}, color={}, key={}, config={}) -> {}", p(comm), color, key, p(config), p(*newcomm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int exclude_count, ncclComm_t* newcomm,
                                        ncclConfig_t* config, int flags) {
  *newcomm = new_comm();
  std::string ranks;
  for (int i = 0; i < exclude_count; ++i) ranks += fmt::format("{}{}", i ? "," : "", exclude[i]);
  record("ncclCommShrink(comm={}, exclude=[{}], count={}, config={}, flags={}) -> {}", p(comm), ranks,
         exclude_count, p(config), flags, p(*newcomm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  record("ncclCommFinalize(comm={})", p(comm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  record("ncclCommDestroy(comm={})", p(comm));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  record("ncclCommAbort(comm={})", p(comm));
  return ncclSuccess;
}
// The queries the engine may make are answered but not recorded: they are not forwarded
// application calls, and recording them would make the log depend on the scheduler's internals.
FAKE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* state) {
  *state = ncclSuccess;
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommCount(const ncclComm_t, int* count) {
  *count = g_comm_count;
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t, int* device) {
  *device = 0;
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t, int* rank) {
  *rank = g_user_rank;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  record("ncclAllReduce(send={}, recv={}, count={}, dtype={}, op={}, comm={}, stream={}) depth={}", sendbuff,
         p(recvbuff), count, static_cast<int>(dtype), static_cast<int>(op), p(comm), p(stream), t_depth);
  if (g_reenter && t_depth == 0) {
    // Look the name up the way a PLT call would bind: the first definition in the global scope.
    using Fn = decltype(&ncclAllReduce);
    auto global = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
    ++t_depth;
    const ncclResult_t r = global ? global(sendbuff, recvbuff, count, dtype, op, comm, stream) : ncclInternalError;
    --t_depth;
    return r;
  }
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  record("ncclReduceScatter(send={}, recv={}, recvcount={}, dtype={}, op={}, comm={}, stream={})", sendbuff,
         p(recvbuff), recvcount, static_cast<int>(dtype), static_cast<int>(op), p(comm), p(stream));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t dtype,
                                       ncclComm_t comm, cudaStream_t stream) {
  record("ncclAllGather(send={}, recv={}, sendcount={}, dtype={}, comm={}, stream={})", sendbuff, p(recvbuff),
         sendcount, static_cast<int>(dtype), p(comm), p(stream));
  return ncclSuccess;
}
// NCCL 2.28 added ncclAlltoAll: the fake of an older NCCL (FAKE_NCCL_BEFORE_2_28) has none.
#ifndef FAKE_NCCL_BEFORE_2_28
FAKE_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                                      ncclComm_t comm, cudaStream_t stream) {
  record("ncclAlltoAll(send={}, recv={}, count={}, dtype={}, comm={}, stream={})", sendbuff, p(recvbuff), count,
         static_cast<int>(dtype), p(comm), p(stream));
  return ncclSuccess;
}
#endif
FAKE_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  record("ncclBroadcast(send={}, recv={}, count={}, dtype={}, root={}, comm={}, stream={})", sendbuff,
         p(recvbuff), count, static_cast<int>(dtype), root, p(comm), p(stream));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t dtype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  record("ncclBcast(buff={}, count={}, dtype={}, root={}, comm={}, stream={})", p(buff), count,
         static_cast<int>(dtype), root, p(comm), p(stream));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dtype,
                                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  record("ncclReduce(send={}, recv={}, count={}, dtype={}, op={}, root={}, comm={}, stream={})", sendbuff,
         p(recvbuff), count, static_cast<int>(dtype), static_cast<int>(op), root, p(comm), p(stream));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t dtype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  record("ncclSend(send={}, count={}, dtype={}, peer={}, comm={}, stream={})", sendbuff, count,
         static_cast<int>(dtype), peer, p(comm), p(stream));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                                  cudaStream_t stream) {
  record("ncclRecv(recv={}, count={}, dtype={}, peer={}, comm={}, stream={})", p(recvbuff), count,
         static_cast<int>(dtype), peer, p(comm), p(stream));
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclGroupStart() {
  record("ncclGroupStart()");
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclGroupEnd() {
  record("ncclGroupEnd()");
  return ncclSuccess;
}
FAKE_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t*) {
  record("ncclGroupSimulateEnd()");
  return ncclSuccess;
}
