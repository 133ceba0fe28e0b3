// Which stage program runs a route (algorithms.hpp).
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {

namespace {

// The flat algorithm of an FP8 route that is not hierarchical.
const Fp8Algorithm& flat_algorithm(Collective collective, const Route& route) {
  if (route.carrier != Carrier::nccl) {  // a direct transport carries one-shot, two-shot, RS, AG and the all-to-all
    switch (collective) {
      case Collective::reduce_scatter: return kDirectReduceScatter;
      case Collective::all_gather: return kDirectAllGather;
      case Collective::all_to_all: return kDirectAllToAll;
      case Collective::all_reduce:
        return route.path == Path::one_shot ? kDirectOneShotAllReduce : kDirectTwoShotAllReduce;
      case Collective::send_recv: break;  // no window: a message's wire buffer is its own
    }
  }
  switch (collective) {
    case Collective::reduce_scatter: return kReduceScatterFp8;
    case Collective::all_gather: return kAllGatherFp8;
    case Collective::all_to_all: return kAllToAllFp8;
    case Collective::send_recv: break;  // no stage program: sched/engine/point_to_point.cpp runs it
    case Collective::all_reduce:
      switch (route.path) {
        case Path::one_shot: return kOneShotAllReduce;
        case Path::ring: return kRingAllReduce;
        default: return kTwoShotAllReduce;
      }
  }
  return kTwoShotAllReduce;
}

}  // namespace

RouteProgram::RouteProgram(Collective collective, const Route& route, const Fp8Args& a, CommState& s) {
  if (route.carrier == Carrier::nccl && route.path == Path::hierarchical) {
    if (collective == Collective::reduce_scatter) program_ = &storage_.emplace<HierarchicalReduceScatter>(a, s);
    else program_ = &storage_.emplace<HierarchicalAllReduce>(a, s, route.inner);
    return;
  }
  program_ = &storage_.emplace<Fp8Program>(flat_algorithm(collective, route), a);
}

}  // namespace fp8wire::sched
