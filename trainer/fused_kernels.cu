#include "trainer/fused_kernels.hpp"

#include <cuda_bf16.h>

#include <algorithm>

namespace fp8wire::trainer::fused {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kVec = 8;  // bf16 per 16-byte vector

// Eight bf16 <-> eight fp32 through one 16-byte load or store.
struct Vec8 {
  float v[kVec];
};
__device__ inline Vec8 load8(const bf16* p) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Vec8 out;
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    out.v[2 * i] = f.x;
    out.v[2 * i + 1] = f.y;
  }
  return out;
}
__device__ inline void store8(bf16* p, const Vec8& x) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) h[i] = __floats2bfloat162_rn(x.v[2 * i], x.v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}
__device__ inline Vec8 load8(const float* p) {
  float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}
// Round to bf16 and back: where the ATen path stores an intermediate as bf16.
__device__ inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Sum over the block, returned to every thread. `scratch` holds one float per warp.
__device__ inline float block_sum(float x, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// --- RMSNorm / adaRMS --------------------------------------------------------------------------
// One row per block in the forward; each thread holds P vectors of the row (threads * P * 8 >= dim).
// The products are rounded one at a time (__fmul_rn, __fadd_rn) as ATen's separate kernels round
// them; only the mean's summation order differs from the ATen path.
template <int P>
__global__ void norm_forward_kernel(const bf16* __restrict__ x, const float* __restrict__ scale,
                                    const float* __restrict__ shift, float eps, int64_t dim, int64_t rows_per_group,
                                    bf16* __restrict__ y, float* __restrict__ rstd) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t g = row / rows_per_group;
  const bf16* xr = x + row * dim;
  Vec8 v[P];
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t col = (int64_t(p) * blockDim.x + threadIdx.x) * kVec;
    if (col < dim) {
      v[p] = load8(xr + col);
#pragma unroll
      for (int k = 0; k < kVec; ++k) ss += v[p].v[k] * v[p].v[k];
    }
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(__fadd_rn(__fdiv_rn(ss, float(dim)), eps));
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t col = (int64_t(p) * blockDim.x + threadIdx.x) * kVec;
    if (col >= dim) continue;
    Vec8 s = load8(scale + g * dim + col), out;
    Vec8 b = shift ? load8(shift + g * dim + col) : Vec8{};
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float o = __fmul_rn(__fmul_rn(v[p].v[k], r), __fadd_rn(1.f, s.v[k]));
      out.v[k] = shift ? __fadd_rn(o, b.v[k]) : o;
    }
    store8(y + row * dim + col, out);
  }
}

// Block (part, group) walks rows [first, last) of its group: dx per row (one block sum per row),
// and column sums of dy * xhat (dscale) and dy (dshift) kept in registers, written once.
//   dxhat = dy * (1 + scale);  dx = rstd * (dxhat - xhat * mean(dxhat * xhat))
template <int P>
__global__ void norm_backward_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                     const float* __restrict__ rstd, const float* __restrict__ scale, int64_t dim,
                                     int64_t rows_per_group, int64_t parts, bf16* __restrict__ dx,
                                     float* __restrict__ dscale_parts, float* __restrict__ dshift_parts) {
  __shared__ float scratch[32];
  const int64_t part = blockIdx.x, g = blockIdx.y;
  const int64_t chunk = (rows_per_group + parts - 1) / parts;
  const int64_t first = g * rows_per_group + min(part * chunk, rows_per_group);
  const int64_t last = g * rows_per_group + min((part + 1) * chunk, rows_per_group);
  Vec8 s[P], acc_s[P], acc_b[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t col = (int64_t(p) * blockDim.x + threadIdx.x) * kVec;
    acc_s[p] = Vec8{};
    acc_b[p] = Vec8{};
    if (col < dim) {
      s[p] = load8(scale + g * dim + col);
#pragma unroll
      for (int k = 0; k < kVec; ++k) s[p].v[k] = __fadd_rn(1.f, s[p].v[k]);
    }
  }
  for (int64_t row = first; row < last; ++row) {
    const float r = rstd[row];
    Vec8 xh[P], gh[P];
    float dot = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t col = (int64_t(p) * blockDim.x + threadIdx.x) * kVec;
      if (col >= dim) continue;
      Vec8 xv = load8(x + row * dim + col), gv = load8(dy + row * dim + col);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        xh[p].v[k] = __fmul_rn(xv.v[k], r);
        gh[p].v[k] = __fmul_rn(gv.v[k], s[p].v[k]);
        dot += gh[p].v[k] * xh[p].v[k];
        acc_s[p].v[k] += gv.v[k] * xh[p].v[k];
        acc_b[p].v[k] += gv.v[k];
      }
    }
    const float mean = block_sum(dot, scratch) / float(dim);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t col = (int64_t(p) * blockDim.x + threadIdx.x) * kVec;
      if (col >= dim) continue;
      Vec8 out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = r * (gh[p].v[k] - xh[p].v[k] * mean);
      store8(dx + row * dim + col, out);
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t col = (int64_t(p) * blockDim.x + threadIdx.x) * kVec;
    if (col >= dim) continue;
    float* ds = dscale_parts + (g * parts + part) * dim + col;
    float* db = dshift_parts ? dshift_parts + (g * parts + part) * dim + col : nullptr;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      ds[k] = acc_s[p].v[k];
      if (db) db[k] = acc_b[p].v[k];
    }
  }
}

// Threads per row and vectors per thread for a row of `dim`: up to 1024 threads, P in {1, 2, 4}.
struct NormLaunch {
  int threads = 0;
  int vectors = 0;
};
NormLaunch norm_launch(int64_t dim) {
  const int64_t vecs = dim / kVec;
  for (int p : {1, 2, 4}) {
    const int64_t t = (vecs + p - 1) / p;
    if (t <= 1024) return {int(std::max<int64_t>(32, (t + 31) / 32 * 32)), p};
  }
  return {};
}

int multiprocessors() {
  static const int count = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return n;
  }();
  return count;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// --- RoPE --------------------------------------------------------------------------------------
// One thread per 8 rotation pairs: 8 of x1 and the matching 8 of x2, 8 cos and 8 sin.
__global__ void rope_kernel(const bf16* __restrict__ x, const float* __restrict__ cos_t,
                            const float* __restrict__ sin_t, RopeShape s, float sin_sign, bf16* __restrict__ out) {
  const int64_t half = s.dim / 2, chunks = half / kVec;
  const int64_t total = s.batch * s.heads * s.seq * chunks;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % chunks, row = i / chunks;
    const int64_t pos = row % s.seq, h = (row / s.seq) % s.heads, b = row / (s.seq * s.heads);
    const bf16* xr = x + b * s.x_stride[0] + h * s.x_stride[1] + pos * s.x_stride[2] + c * kVec;
    bf16* orow = out + b * s.out_stride[0] + h * s.out_stride[1] + pos * s.out_stride[2] + c * kVec;
    const int64_t cs = b * s.cs_stride[0] + pos * s.cs_stride[1] + c * kVec;
    Vec8 x1 = load8(xr), x2 = load8(xr + half), co = load8(cos_t + cs), si = load8(sin_t + cs), o1, o2;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float sn = sin_sign * si.v[k];  // exact: a sign flip
      o1.v[k] = __fsub_rn(__fmul_rn(x1.v[k], co.v[k]), __fmul_rn(x2.v[k], sn));
      o2.v[k] = __fadd_rn(__fmul_rn(x2.v[k], co.v[k]), __fmul_rn(x1.v[k], sn));
    }
    store8(orow, o1);
    store8(orow + half, o2);
  }
}

// --- gated GELU --------------------------------------------------------------------------------
// ATen's tanh GELU (GeluCUDAKernelImpl) in fp32, its constants and operation order.
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2) * 2/sqrt(pi) * 0.5
constexpr float kKappa = 0.044715f;
__device__ inline float gelu_tanh(float x) {
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.f + tanhf(inner));
}
__device__ inline float gelu_tanh_grad(float x) {
  const float x_sq = x * x;
  const float inner = kBeta * (x + kKappa * (x_sq * x));
  const float t = tanhf(inner);
  const float left = 0.5f * x, right = 1.f + t;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - t * t;
  const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return left_derivative + right_derivative;
}

__global__ void gelu_mul_forward_kernel(const bf16* __restrict__ g, const bf16* __restrict__ u, int64_t vectors,
                                        bf16* __restrict__ z) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    Vec8 gv = load8(g + i * kVec), uv = load8(u + i * kVec), out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = __fmul_rn(round_bf16(gelu_tanh(gv.v[k])), uv.v[k]);
    store8(z + i * kVec, out);
  }
}

__global__ void gelu_mul_backward_kernel(const bf16* __restrict__ dz, const bf16* __restrict__ g,
                                         const bf16* __restrict__ u, int64_t vectors, bf16* __restrict__ dg,
                                         bf16* __restrict__ du) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    Vec8 dv = load8(dz + i * kVec), gv = load8(g + i * kVec), uv = load8(u + i * kVec), og, ou;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float dgelu = round_bf16(__fmul_rn(dv.v[k], uv.v[k]));
      og.v[k] = dgelu * gelu_tanh_grad(gv.v[k]);
      ou.v[k] = __fmul_rn(dv.v[k], round_bf16(gelu_tanh(gv.v[k])));
    }
    store8(dg + i * kVec, og);
    store8(du + i * kVec, ou);
  }
}

int elementwise_blocks(int64_t work, int threads) {
  const int64_t wanted = (work + threads - 1) / threads;
  return int(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(multiprocessors()) * 16)));
}

}  // namespace

bool norm_supported(const NormShape& s) {
  return s.rows > 0 && s.dim > 0 && s.dim % kVec == 0 && s.rows_per_group > 0 && s.rows % s.rows_per_group == 0 &&
         norm_launch(s.dim).threads > 0;
}

cudaError_t norm_forward(const void* x, const float* scale, const float* shift, float eps, const NormShape& s,
                         void* y, float* rstd, cudaStream_t stream) {
  const NormLaunch l = norm_launch(s.dim);
  if (!norm_supported(s) || !aligned16(x) || !aligned16(y) || !aligned16(scale) || (shift && !aligned16(shift)))
    return cudaErrorInvalidValue;
  auto launch = [&](auto kernel) {
    kernel<<<unsigned(s.rows), unsigned(l.threads), 0, stream>>>(static_cast<const bf16*>(x), scale, shift, eps, s.dim,
                                                                 s.rows_per_group, static_cast<bf16*>(y), rstd);
  };
  if (l.vectors == 1) launch(norm_forward_kernel<1>);
  else if (l.vectors == 2) launch(norm_forward_kernel<2>);
  else launch(norm_forward_kernel<4>);
  return cudaGetLastError();
}

int64_t norm_backward_parts(const NormShape& s) {
  if (!norm_supported(s)) return 0;
  // About four blocks per multiprocessor over all groups; each part keeps a few rows at least so
  // the partial sums stay a small fraction of the traffic.
  const int64_t wanted = (int64_t(multiprocessors()) * 4 + s.groups() - 1) / s.groups();
  return std::max<int64_t>(1, std::min<int64_t>(wanted, (s.rows_per_group + 3) / 4));
}

cudaError_t norm_backward(const void* dy, const void* x, const float* rstd, const float* scale, const NormShape& s,
                          void* dx, float* dscale_parts, float* dshift_parts, cudaStream_t stream) {
  const NormLaunch l = norm_launch(s.dim);
  const int64_t parts = norm_backward_parts(s);
  if (parts == 0 || !aligned16(dy) || !aligned16(x) || !aligned16(dx) || !aligned16(scale)) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(parts), unsigned(s.groups()));
  auto launch = [&](auto kernel) {
    kernel<<<grid, unsigned(l.threads), 0, stream>>>(static_cast<const bf16*>(dy), static_cast<const bf16*>(x), rstd,
                                                     scale, s.dim, s.rows_per_group, parts, static_cast<bf16*>(dx),
                                                     dscale_parts, dshift_parts);
  };
  if (l.vectors == 1) launch(norm_backward_kernel<1>);
  else if (l.vectors == 2) launch(norm_backward_kernel<2>);
  else launch(norm_backward_kernel<4>);
  return cudaGetLastError();
}

bool rope_supported(const RopeShape& s, const void* x, const void* out, const float* cos, const float* sin) {
  if (s.batch <= 0 || s.heads <= 0 || s.seq <= 0 || s.dim <= 0 || s.dim % (2 * kVec) != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (s.x_stride[i] % kVec != 0 || s.out_stride[i] % kVec != 0) return false;
  for (int i = 0; i < 2; ++i)
    if (s.cs_stride[i] % 4 != 0) return false;
  return aligned16(x) && aligned16(out) && aligned16(cos) && aligned16(sin);
}

cudaError_t rope(const void* x, const float* cos, const float* sin, const RopeShape& s, bool inverse, void* out,
                 cudaStream_t stream) {
  if (!rope_supported(s, x, out, cos, sin)) return cudaErrorInvalidValue;
  const int threads = 256;
  const int64_t work = s.batch * s.heads * s.seq * (s.dim / 2 / kVec);
  rope_kernel<<<elementwise_blocks(work, threads), threads, 0, stream>>>(
      static_cast<const bf16*>(x), cos, sin, s, inverse ? -1.f : 1.f, static_cast<bf16*>(out));
  return cudaGetLastError();
}

bool gelu_mul_supported(int64_t n, const void* a, const void* b, const void* c) {
  return n > 0 && n % kVec == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

cudaError_t gelu_mul_forward(const void* g, const void* u, int64_t n, void* z, cudaStream_t stream) {
  if (!gelu_mul_supported(n, g, u, z)) return cudaErrorInvalidValue;
  const int threads = 256;
  gelu_mul_forward_kernel<<<elementwise_blocks(n / kVec, threads), threads, 0, stream>>>(
      static_cast<const bf16*>(g), static_cast<const bf16*>(u), n / kVec, static_cast<bf16*>(z));
  return cudaGetLastError();
}

cudaError_t gelu_mul_backward(const void* dz, const void* g, const void* u, int64_t n, void* dg, void* du,
                              cudaStream_t stream) {
  if (!gelu_mul_supported(n, dz, g, u) || !gelu_mul_supported(n, dg, du, dz)) return cudaErrorInvalidValue;
  const int threads = 256;
  gelu_mul_backward_kernel<<<elementwise_blocks(n / kVec, threads), threads, 0, stream>>>(
      static_cast<const bf16*>(dz), static_cast<const bf16*>(g), static_cast<const bf16*>(u), n / kVec,
      static_cast<bf16*>(dg), static_cast<bf16*>(du));
  return cudaGetLastError();
}

}  // namespace fp8wire::trainer::fused
