// The application's own messages (ncclSend / ncclRecv) in FP8, where their route says so: the sender
// quantizes the message into a wire buffer of its own and sends that; the receiver receives the wire
// bytes and decodes them into its buffer. Both ends size the wire from the message's count, dtype and
// the agreed format (NCCL's contract makes the two counts equal) and take the same route from what
// both see alike (the configuration, the communicator's agreed facts, the count, the dtype): no size
// and no flag is exchanged.
//
// Everything runs on the caller's stream, in its order, and the real send or receive is issued where
// the application issued its own: inside its group when one is open. The group's transfers then go
// out together at its end whatever order each rank issued them in, so rings and pairs complete as
// they do under NCCL alone.
//
// The wire buffer is stream-ordered memory (CudaApi::MallocAsync), released on the caller's stream
// once the stream has passed the message: at once outside a group, after the outermost ncclGroupEnd
// inside one (NCCL enqueues the group's transfers there; a received message is decoded there too).
// Under graph capture the buffer is a graph allocation that lives with the graph.
#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/plan/recipe.hpp"

namespace fp8wire::sched {

namespace {

ncclResult_t cuda_step(const Platform& p, cudaError_t err, uint64_t comm_id, const char* what) {
  if (err == cudaSuccess) return ncclSuccess;
  FP8WIRE_ERROR("comm {}: {} failed: {}", comm_id, what, p.cuda.GetErrorString(err));
  return ncclUnhandledCudaError;
}

// Decodes a received message (where `decode`) and releases its wire buffer, on its stream.
ncclResult_t finish_message(const Platform& p, const PendingMessage& m, bool decode) {
  const uint64_t id = m.state ? m.state->id : 0;
  ncclResult_t res = ncclSuccess;
  if (decode && m.decode_into) {
    quant::LaunchOptions opt;
    opt.path = m.convert_path;
    res = cuda_step(p, p.codec.dequantize(m.wire, quant::Segmented::single(m.count, m.format), m.count, m.decode_into,
                                          m.type, m.format, m.stream, opt), id, "decoding a received message");
  }
  const ncclResult_t freed = cuda_step(p, p.cuda.FreeAsync(m.wire, m.stream), id, "releasing a message's wire buffer");
  return nccl_ok(res) ? freed : res;
}

}  // namespace

// The sending end's quantize, with its watch (sched/plan/recipe.cpp, message_watch): a measured
// message's record zeroed before the quantize and read back after it; an audited one's wire decoded
// beside a copy of the caller's data, both read back and compared once the stream has passed them.
ncclResult_t Engine::Impl::quantize_message(CommState& s, const Call& c, const Recipe& recipe,
                                            const PendingMessage& m, uint64_t seq) {
  const Platform& p = *platform;
  const Watch& w = recipe.watch;
  const quant::Segmented layout = quant::Segmented::single(c.count, recipe.format);
  const size_t bytes = c.count * quant::elem_size(m.type);
  TelemetryMonitor::Call measured;
  if (w.active) {
    if (!s.telemetry) s.telemetry = std::make_unique<TelemetryMonitor>(*s.platform, s.id, s.rank);
    s.telemetry->fold_completed();  // a communicator of messages only has no collective to fold them
    FP8WIRE_TRY(s.telemetry->begin(w, c.collective, recipe.route.path, seq, &measured));
  }
  quant::LaunchOptions opt;
  opt.path = recipe.convert_path;
  opt.telemetry = measured.options;
  ncclResult_t res = ncclSuccess;
  if (measured.slot >= 0)
    res = cuda_step(p, p.cuda.MemsetAsync(s.telemetry->device_record(measured.slot), 0, sizeof(quant::CallTelemetry),
                                          c.stream), s.id, "zeroing a message's telemetry record");
  if (nccl_ok(res))
    res = cuda_step(p, p.codec.quantize(c.send, m.type, c.count, m.wire, layout, recipe.format, c.stream, opt), s.id,
                    "quantizing a message");
  bool recorded = false;
  if (nccl_ok(res) && measured.slot >= 0) {
    res = cuda_step(p, s.telemetry->read_back(measured.slot, c.stream), s.id, "reading a message's telemetry record back");
    recorded = nccl_ok(res);
  }
  if (s.telemetry) s.telemetry->end(measured, recorded);
  if (!nccl_ok(res) || !w.audited) return res;
  void *decoded = nullptr, *exact = nullptr;
  FP8WIRE_TRY(s.telemetry->audit_buffers(bytes, bytes, &decoded, &exact));
  quant::LaunchOptions unmeasured;  // the audit's decode measures nothing
  unmeasured.path = recipe.convert_path;
  FP8WIRE_TRY(cuda_step(p, p.cuda.MemcpyAsync(exact, c.send, bytes, cudaMemcpyDeviceToDevice, c.stream), s.id,
                        "copying an audited message"));
  FP8WIRE_TRY(cuda_step(p, p.codec.dequantize(m.wire, layout, c.count, decoded, m.type, recipe.format, c.stream,
                                            unmeasured),
                        s.id, "decoding an audited message"));
  return s.telemetry->audit_read_back(c.stream, decoded, bytes, dtype_of(c.dtype), c.collective, recipe.route.path,
                                      seq);
}

ncclResult_t Engine::Impl::run_message(const CommRef& sref, const Call& c, const Route& route, uint64_t seq,
                                       uint64_t issue) {
  CommState& s = *sref;
  const bool sending = c.direction == PeerDirection::send;
  // A peer outside the communicator: NCCL's own answer (ncclInvalidArgument).
  if (c.peer < 0 || c.peer >= s.nranks) return run_plain(c, &s, Path::passthrough, seq, issue);
  // An earlier FP8 call on the communicator failed: it is out of step with its peers until aborted.
  if (const ncclResult_t failed = s.failed(); failed != ncclSuccess) return failed;

  CallRecord rec;
  rec.seq = seq;
  rec.comm_id = s.id;
  rec.kind = kind_of(c);
  rec.path = route.path;
  rec.transport = Carrier::nccl;
  rec.dtype = c.dtype;
  rec.nranks = s.nranks;
  rec.rank = s.rank;
  rec.count = c.count;
  rec.issue_ns = issue;
  quant::ElemType type = quant::ElemType::f32;
  elem_type_of(dtype_of(c.dtype), &type);
  rec.app_bytes = c.count * quant::elem_size(type);
  const CommIdentity who = s.identity();
  rec.plain_wire_bytes = plain_wire_bytes(c, &who);
  CallHookScope hooks(rec);
  NvtxRange range(sending ? "fp8wire send" : "fp8wire recv");

  // The pair's message number: both ends count the pair's FP8 messages alike.
  std::vector<uint64_t>& numbers = s.messages[sending ? 0 : 1];
  if (numbers.size() != static_cast<size_t>(s.nranks)) numbers.assign(static_cast<size_t>(s.nranks), 0);
  CallContext context;
  context.peer = PeerCall{c.direction, c.peer, numbers[static_cast<size_t>(c.peer)]++};
  const Recipe recipe = recipe_for(config, facts_of(s), shape_of(c, &s), route, context);

  const size_t wire_bytes = quant::chunk_bytes(c.count, recipe.format);
  PendingMessage m;
  m.stream = c.stream;
  m.decode_into = sending ? nullptr : c.recv;
  m.count = c.count;
  m.type = type;
  m.format = recipe.format;
  m.convert_path = recipe.convert_path;
  m.state = sref;
  ncclResult_t res = cuda_step(*platform, platform->cuda.MallocAsync(&m.wire, wire_bytes, c.stream), s.id,
                               "allocating a message's wire buffer");
  if (nccl_ok(res) && sending) res = quantize_message(s, c, recipe, m, seq);
  bool issued = false;
  if (nccl_ok(res)) {
    res = sending ? api->Send(m.wire, wire_bytes, ncclUint8, c.peer, c.comm, c.stream)
                  : api->Recv(m.wire, wire_bytes, ncclUint8, c.peer, c.comm, c.stream);
    issued = nccl_ok(res);
  }
  ThreadGroup& tg = thread_group();
  if (m.wire && issued && tg.group.inside()) {
    tg.messages.push_back(std::move(m));  // NCCL issues it at the group's end: finished there
  } else if (m.wire) {
    const ncclResult_t finished = finish_message(*platform, m, issued);
    if (nccl_ok(res)) res = finished;
  }
  // The peer waits for this message (or sends one nobody receives): the communicator is out of step.
  if (!nccl_ok(res)) s.fail(res);
  rec.wire_bytes = sending ? wire_bytes : 0;

  if (!s.logged_messages && nccl_ok(res)) {
    s.logged_messages = true;
    FP8WIRE_INFO("comm {} ({} ranks, fabric {}): first FP8 point-to-point message ({} to rank {}, {} B of caller "
                 "data, {} B on the wire)", s.id, s.nranks, to_string(s.agreement.fabric), sending ? "send" : "recv",
                 c.peer, rec.app_bytes, wire_bytes);
  }
  FP8WIRE_DEBUG("seq {} {} {} x{} comm {} peer {} message {}, wire {} B{}", seq, sending ? "send" : "recv", c.count,
                quant::elem_size(type), s.id, c.peer, context.peer.pair_seq, wire_bytes,
                nccl_ok(res) ? "" : " FAILED");
  hooks.end();
  Accounting::instance().record(rec);
  return res;
}

ncclResult_t Engine::Impl::finish_messages(ThreadGroup& tg, ncclResult_t group_end) {
  const bool issued = nccl_ok(group_end);
  ncclResult_t first = ncclSuccess;
  // A group with a non-blocking communicator in it may still be issuing its operations when its end
  // returns: a message is decoded and released only once its communicator has left that state.
  if (group_end == ncclInProgress && api->CommGetAsyncError)
    for (const PendingMessage& m : tg.messages) {
      ncclResult_t state = ncclInProgress;
      while (state == ncclInProgress && api->CommGetAsyncError(m.state->comm, &state) == ncclSuccess) {
      }
    }
  for (PendingMessage& m : tg.messages) {
    const ncclResult_t res = finish_message(*platform, m, issued);
    if (!nccl_ok(res)) {
      if (m.state) m.state->fail(res);
      if (nccl_ok(first)) first = res;
    }
  }
  tg.messages.clear();  // their communicators released now
  return first;
}

}  // namespace fp8wire::sched
