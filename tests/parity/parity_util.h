// Parity harness: both backends, seeded random inputs, device buffers, the element-wise compare
// and the summary table printed after all tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace moe::parity {

using kernels::Backend;
using kernels::DType;
using kernels::TensorView;

// The two backends, made once for the whole binary (ParityEnvironment). GPU creation failing is a
// test failure, never a skip: this binary only runs where a GPU is promised (ctest label gpu).
Backend& Cpu();
Backend& Gpu();

// Uniform floats in [lo, hi) from a generator seeded by the case.
std::vector<float> Random(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f);

// Host bytes of a weight in `dtype` (rounded from `values`), with a view the CPU backend reads,
// and the same bytes uploaded for the GPU backend.
struct HostWeight {
  std::vector<uint8_t> bytes;
  TensorView cpu;
  kernels::DeviceTensor gpu;
};
HostWeight MakeWeight(const std::vector<float>& values, DType dtype,
                      std::initializer_list<int64_t> shape);
// The same for every dtype: dense ones as MakeWeight, quantized ones (kQ8/kQ4/kQ2) through
// kernels::Quantize with `group_size` (both backends then read the same codes and scales).
HostWeight MakeAnyWeight(const std::vector<float>& values, DType dtype, int32_t group_size,
                         std::initializer_list<int64_t> shape);

// A device copy of a host array; Read() copies it back.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    auto buf = Gpu().Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(buf.ok()) << buf.status();
    buf_ = std::move(buf).value();
    if (n_ > 0) Gpu().CopyToDevice(buf_.data(), host.data(), n_ * sizeof(T));
  }
  T* get() const { return static_cast<T*>(buf_.data()); }
  std::vector<T> Read() const {
    std::vector<T> host(n_);
    if (n_ > 0) Gpu().CopyToHost(host.data(), buf_.data(), n_ * sizeof(T));
    return host;
  }

 private:
  size_t n_;
  kernels::Buffer buf_;
};

// A GPU output buffer poisoned with NaN, so that an element the kernel skips fails the compare.
DeviceArray<float> PoisonedOutput(size_t n);

// Compares every element of `got` (GPU) with `want` (CPU). An element's error is
// |got - want| / max(|want|, rms(want)): relative, floored at the tensor's RMS so that entries
// that cancel to ~0 do not turn rounding into a failure. Fails on any non-finite `got` where
// `want` is finite, and when the largest error exceeds `tol`. Adds a row to the summary table.
void ExpectClose(const std::string& op, const std::string& name, const std::vector<float>& got,
                 const std::vector<float>& want, double tol);
// Integer outputs (expert ids) must match exactly.
void ExpectEqualIds(const std::string& op, const std::string& name,
                    const std::vector<int32_t>& got, const std::vector<int32_t>& want);

}  // namespace moe::parity
