// NVTX ranges in the "fp8wire" domain around the library's own phases (quantize, exchange, reduce,
// gather, dequantize), so a profiler can tell them from the application's ranges.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace fp8wire {

inline nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("fp8wire");
  return domain;
}

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
    nvtxEventAttributes_t attr{};
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = name;
    nvtxDomainRangePushEx(nvtx_domain(), &attr);
  }
  ~NvtxRange() { nvtxDomainRangePop(nvtx_domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace fp8wire
