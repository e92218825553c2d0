// Activations a normalization kernel may apply to its output, and their derivatives, in the
// accumulation type. Ids and definitions match cunorm/activations.py (PyTorch's formulas and
// defaults: relu' = 0 at 0, softplus threshold 20, hardswish' = z / 3 + 0.5 on [-3, 3]).
// A kernel takes the id as an argument (ActAny: one uniform switch per element, one
// instantiation for all twelve) or as a constant (ActFixed: the switch folds away), so the
// common cases, none and ReLU, cost nothing extra.
#pragma once

namespace cunorm {

enum Activation {
  kIdentity = 0, kRelu = 1, kLeakyRelu = 2, kGelu = 3, kGeluTanh = 4, kSilu = 5, kSigmoid = 6,
  kTanh = 7, kMish = 8, kElu = 9, kHardswish = 10, kSoftplus = 11
};

// double, cast to the accumulation type where used: as float constants they held float64's
// GELU to float precision (1e-8 relative; the float32 kernels' values are the same either way)
constexpr double kSoftplusThreshold = 20.0;
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

__device__ __forceinline__ float sigmoid_f(float z) { return 1.0f / (1.0f + __expf(-z)); }
__device__ __forceinline__ double sigmoid_f(double z) { return 1.0 / (1.0 + exp(-z)); }

template <typename A>
__device__ __forceinline__ A softplus_f(A z, A beta) {
  const A bz = beta * z;
  return bz > A(kSoftplusThreshold) ? z : log1p(exp(bz)) / beta;
}

template <typename A>
__device__ __forceinline__ A act_forward(int id, A z, A p) {
  switch (id) {
    case kRelu: return z > A(0) ? z : A(0);
    case kLeakyRelu: return z > A(0) ? z : p * z;
    case kGelu: return A(0.5) * z * (A(1) + erf(z * A(kInvSqrt2)));
    case kGeluTanh: return A(0.5) * z * (A(1) + tanh(A(kSqrt2OverPi) * (z + A(0.044715) * z * z * z)));
    case kSilu: return z * sigmoid_f(z);
    case kSigmoid: return sigmoid_f(z);
    case kTanh: return tanh(z);
    case kMish: return z * tanh(softplus_f(z, A(1)));
    case kElu: return z > A(0) ? z : p * expm1(z);
    case kHardswish: return z * fmin(fmax(z + A(3), A(0)), A(6)) / A(6);
    case kSoftplus: return softplus_f(z, p);
    default: return z;
  }
}

template <typename A>
__device__ __forceinline__ A act_derivative(int id, A z, A p) {
  switch (id) {
    case kRelu: return z > A(0) ? A(1) : A(0);
    case kLeakyRelu: return z > A(0) ? A(1) : p;
    case kGelu: return A(0.5) * (A(1) + erf(z * A(kInvSqrt2))) + z * exp(A(-0.5) * z * z) * A(kInvSqrt2Pi);
    case kGeluTanh: {
      const A t = tanh(A(kSqrt2OverPi) * (z + A(0.044715) * z * z * z));
      return A(0.5) * (A(1) + t) + A(0.5) * z * (A(1) - t * t) * A(kSqrt2OverPi) * (A(1) + A(3 * 0.044715) * z * z);
    }
    case kSilu: {
      const A s = sigmoid_f(z);
      return s * (A(1) + z * (A(1) - s));
    }
    case kSigmoid: {
      const A s = sigmoid_f(z);
      return s * (A(1) - s);
    }
    case kTanh: {
      const A t = tanh(z);
      return A(1) - t * t;
    }
    case kMish: {
      const A t = tanh(softplus_f(z, A(1)));
      return t + z * sigmoid_f(z) * (A(1) - t * t);
    }
    case kElu: return z > A(0) ? A(1) : p * exp(z);
    case kHardswish: return z < A(-3) ? A(0) : (z <= A(3) ? z / A(3) + A(0.5) : A(1));
    case kSoftplus: return p * z > A(kSoftplusThreshold) ? A(1) : sigmoid_f(p * z);
    default: return A(1);
  }
}

// A compile-time activation id (the switches above fold) or a run-time one; tag() gives it.
template <int ID> struct ActFixed { __device__ __forceinline__ int operator()() const { return ID; } };
struct ActAny {
  int id;
  __device__ __forceinline__ int operator()() const { return id; }
};

}  // namespace cunorm
