// Which stage program runs a route (algorithms.hpp).
#include "sched/algorithms/algorithms.hpp"

namespace fp8wire::sched {

RouteProgram::RouteProgram(Collective collective, const Route& route, const Fp8Args& a, CommState& s) {
  if (route.carrier != Carrier::nccl) {  // a direct transport carries one-shot, two-shot, RS and AG
    switch (collective) {
      case Collective::reduce_scatter: program_ = &storage_.emplace<DirectReduceScatter>(a); return;
      case Collective::all_gather: program_ = &storage_.emplace<DirectAllGather>(a); return;
      case Collective::all_reduce:
        if (route.path == Path::one_shot) program_ = &storage_.emplace<DirectOneShotAllReduce>(a);
        else program_ = &storage_.emplace<DirectTwoShotAllReduce>(a);
        return;
      case Collective::all_to_all: break;  // no direct program: the route never gives it a window
    }
  }
  if (route.path == Path::hierarchical) {
    if (collective == Collective::reduce_scatter) program_ = &storage_.emplace<HierarchicalReduceScatter>(a, s);
    else program_ = &storage_.emplace<HierarchicalAllReduce>(a, s, route.inner);
    return;
  }
  switch (collective) {
    case Collective::reduce_scatter: program_ = &storage_.emplace<ReduceScatterFp8>(a); return;
    case Collective::all_gather: program_ = &storage_.emplace<AllGatherFp8>(a); return;
    case Collective::all_to_all: program_ = &storage_.emplace<AllToAllFp8>(a); return;
    case Collective::all_reduce:
      switch (route.path) {
        case Path::one_shot: program_ = &storage_.emplace<OneShotAllReduce>(a); return;
        case Path::ring: program_ = &storage_.emplace<RingAllReduce>(a); return;
        default: program_ = &storage_.emplace<TwoShotAllReduce>(a); return;
      }
  }
  program_ = &storage_.emplace<TwoShotAllReduce>(a);
}

}  // namespace fp8wire::sched
