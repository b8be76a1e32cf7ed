"""C++ codegen, the expression level: the prelude, index expressions, the render table (one
rendering per loop op), and CppBodyWriter, which prints a body Value as C++ statements with common
subexpressions shared (codegen/body.py holds what it shares with the Triton writer).

Math calls reach glibc's vector library through `declare simd` prototypes (with -fno-math-errno)
without -ffast-math, so NaN, -0.0 and integer division behave as in ATen; every lane count and
the scalar call run one libmvec variant, so one input gives one result in every loop. The loop
nests around bodies are in codegen/cpp_kernel.py. Corresponds to torch/_inductor/codegen/cpp.py.
"""
from __future__ import annotations

import re
from typing import Sequence

import sympy
import torch

from kiln.lower.checks import CPP_PRELUDE as CHECKS_PRELUDE, guard_divisor, render_index_ok
from kiln.lower.codegen.body import BodyWriter, RenderTable, arg_dtype
from kiln.lower.ir import Const, Index, Load, Masked, Op, Value, walk
from kiln.symbolic.render import render_c

CTYPE = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
         torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
         torch.float16: "_Float16", torch.bfloat16: "uint16_t"}
PARALLEL_MIN = 32768  # elements of work below which a kernel stays on one thread

MATH = ("exp log sin cos tan tanh erf erfc expm1 log1p log2 log10 exp2 asin acos atan sinh cosh asinh "
        "acosh atanh").split()

MATH2 = ("pow", "atan2", "hypot")


def math_prelude(used: set[str]) -> str:
    """C++ for the math functions named in `used` (e.g. {"expf", "log"}): kiln_<name>, with the
    vector variants `declare simd` lets a vectorized loop call.

    One input must give one result wherever it is computed: a max or amax backward finds the
    maximum again by comparing the saved result with the input recomputed in another loop (or in
    the backward graph), so exp(x) at the same x must have the same bits in a vector lane, in a
    loop's remainder and in a loop that did not vectorize. glibc's scalar expf and each of
    libmvec's SSE, AVX2 and AVX-512 variants round differently on some inputs, so on x86-64 every
    variant here, and the scalar function, runs one libmvec variant: the widest the machine has
    (AVX-512, else AVX2), on a broadcast, a widened register or the halves of a wider one.
    Elsewhere the functions are plain scalar libm calls without vector variants: loops that call
    them stay scalar, and agree. GCC's vector types stand in for <immintrin.h>, which would double
    the compile time of a small library."""
    names = sorted(used)
    out = ['#if defined(__x86_64__) && (defined(__AVX512F__) || defined(__AVX2__))', 'extern "C" {']
    out += [f"typedef {t} kiln_{t}x{n} __attribute__((vector_size({n * size})));"
            for t, size in (("float", 4), ("double", 8)) for n in (64 // size, 32 // size, 16 // size)]
    for isa, bits in (("e", 512), ("d", 256)):
        out.append("#ifdef __AVX512F__" if isa == "e" else "#else")
        for fn in names:
            out += _one_implementation(fn, isa, bits)
    out.append("#endif")
    # the scalar function is the lane-0 one under its kiln_ name, an alias the compiler does not
    # see (given a body with `declare simd`, it would make vector copies of its own)
    out += ["}"] + [f'asm(".globl kiln_{fn}\\n.set kiln_{fn}, kiln_{fn}_lane0");' for fn in names]
    out.append("#else")
    for fn in names:
        t, args = _math_signature(fn)
        params = ", ".join(f"{t} {a}" for a in args)
        out.append(f"static inline {t} kiln_{fn}({params}) {{ return {fn}({', '.join(args)}); }}")
    return "\n".join(out + ["#endif"])


def _math_signature(fn: str) -> tuple[str, tuple[str, ...]]:
    """("float" or "double", argument names) of a libm name such as "expf" or "atan2"."""
    single = fn.endswith("f") and fn[:-1] in (*MATH, *MATH2)
    name = fn[:-1] if single else fn
    return ("float" if single else "double"), ("x", "y")[:2 if name in MATH2 else 1]


EXP_ZERO_BELOW = {"expf": "-104.0f", "exp": "-746.0"}  # exp rounds to +0 below these


def _one_implementation(fn: str, isa: str, bits: int) -> list[str]:
    """kiln_<fn>_lane0 and kiln_<fn>'s SSE, AVX, AVX2 and AVX-512 variants, all through libmvec's
    variant `isa` ("e": AVX-512, "d": AVX2), `bits` wide."""
    t, args = _math_signature(fn)
    size = 4 if t == "float" else 8
    wide = bits // 8 // size
    mark = "v" * len(args)
    impl = f"_ZGV{isa}N{wide}{mark}_{fn}"

    def vec(n: int) -> str:
        return f"kiln_{t}x{n}"

    def params(ty: str) -> str:
        return ", ".join(f"{ty} {a}" for a in args)

    def shuffle(a: str, b: str, lanes: Sequence[int]) -> str:
        return f"__builtin_shufflevector({a}, {b}, {', '.join(map(str, lanes))})"

    def variant(n: int) -> str:  # n lanes in, n lanes out, by the `wide`-lane implementation
        if n == wide:
            return f"return {impl}({', '.join(args)});"
        if n < wide:  # fill the wide register with copies (any lanes would do: they are dropped)
            r = f"{impl}({', '.join(shuffle(a, a, [i % n for i in range(wide)]) for a in args)})"
            return f"{vec(wide)} r = {r}; return {shuffle('r', 'r', range(n))};"
        halves = [f"{impl}({', '.join(shuffle(a, a, range(h * wide, (h + 1) * wide)) for a in args)})" for h in (0, 1)]
        return f"{vec(wide)} lo = {halves[0]}, hi = {halves[1]}; return {shuffle('lo', 'hi', range(n))};"

    out = [f"{vec(wide)} {impl}({', '.join([vec(wide)] * len(args))});"]
    if fn in EXP_ZERO_BELOW:
        # libmvec's exp sends a whole register down its slow scalar path when one lane underflows,
        # and a causal softmax's masked lanes are exp(-inf): those lanes get +0 (what libmvec
        # returns for them, checked for every float below the limit) without the call seeing them
        low = f"(x < {EXP_ZERO_BELOW[fn]})"
        out.append(f"static inline {vec(wide)} kiln_{fn}_w({vec(wide)} x) {{ {vec(wide)} zero = {{}}; "
                   f"return {low} ? zero : {impl}({low} ? zero : x); }}")
        impl = f"kiln_{fn}_w"
    out += ["#pragma omp declare simd notinbranch",
           f"{t} kiln_{fn}({', '.join([t] * len(args))}) __attribute__((const, nothrow));",
           # each argument splat into every lane as `a - 0`, which keeps a -0.0 (`0 + a` made it +0.0:
           # the scalar pow(-0.0, -1) was +inf, sin(-0.0) +0.0, where the vector lanes and eager agree)
           f"__attribute__((used)) {t} kiln_{fn}_lane0({params(t)}) "
           f"{{ return {impl}({', '.join(a + ' - ' + vec(wide) + '{}' for a in args)})[0]; }}"]
    for variant_isa, n_bits in (("b", 128), ("c", 256), ("d", 256), ("e", 512)):
        n = n_bits // 8 // size
        if n_bits > bits:
            continue  # no wider registers on this machine: the compiler will not ask for it
        out.append(f"{vec(n)} _ZGV{variant_isa}N{n}{mark}_kiln_{fn}({params(vec(n))}) {{ {variant(n)} }}")
    return out


PRELUDE_TEMPLATE = r"""
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <omp.h>
// Every parallel loop runs on torch.get_num_threads() threads. The runtime hands that count over
// with kiln_set_num_threads when it loads the library and again whenever it changes, instead of
// each loop asking OpenMP: the OpenMP runtime this library links need not be the one that
// torch.set_num_threads configures, and OpenMP's count is per calling thread.
static int kiln_num_threads = 0;  // 0 until the runtime sets it: OpenMP's own default then
static int kiln_adaptive = 0;     // kiln.config.adaptive_threads
static int kiln_adapted = 0;      // the load check's last answer (0: check again)
static int64_t kiln_checked_ns = 0;
extern "C" void kiln_set_num_threads(int threads, int adaptive) {
  kiln_num_threads = threads > 0 ? threads : 1;
  kiln_adaptive = adaptive;
  kiln_adapted = 0;
}
static inline int kiln_all_threads() {
  return kiln_num_threads > 0 ? kiln_num_threads : omp_get_max_threads();
}
static inline int kiln_threads() {
  // Threads for a loop short enough to be hurt by a busy machine. Only when the user opted in (like
  // OMP_DYNAMIC): when other processes keep every CPU busy (more runnable threads than CPUs in
  // /proc/loadavg besides ours), joining a second thread waits for the scheduler, which costs
  // milliseconds per loop, so the loop runs on the calling thread. Re-read every 100 ms.
  int threads = kiln_all_threads();
  if (!kiln_adaptive || threads == 1) return threads;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
  if (kiln_adapted == 0 || now - kiln_checked_ns > 100000000LL) {
    int runnable = 0, field = 0;
    char text[128] = {0};
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      size_t n = std::fread(text, 1, sizeof(text) - 1, f);
      std::fclose(f);
      for (size_t i = 0; i < n && field < 4; i++) {  // "0.50 0.40 0.30 3/120 4567": the 3
        if (text[i] == ' ') field++;
        else if (field == 3 && text[i] >= '0' && text[i] <= '9') runnable = runnable * 10 + (text[i] - '0');
        else if (field == 3) break;
      }
    }
    // runnable counts this process's threads too (the caller and workers still spinning)
    kiln_adapted = (runnable - threads >= omp_get_num_procs()) ? 1 : threads;
    kiln_checked_ns = now;
  }
  return kiln_adapted;
}
// the thread count the next short parallel loop would use (for tests and debugging)
extern "C" int kiln_get_num_threads() { return kiln_threads(); }
// Integer division traps (SIGFPE) on a zero divisor and on the one quotient that overflows, the
// type's minimum divided by -1. ATen raises on zero (the kernel records it, see kiln.lower.checks,
// and yields 0), and for -1 gives the wrapped negation and a remainder of 0: so does every helper
// here, in the operands' own type (int8 and int16 are promoted to int, which does not overflow).
template <typename T> static inline T kiln_negate_wrapping(T a) {
  return (T)(0ULL - (unsigned long long)a);  // two's complement: the minimum stays the minimum
}
template <typename T> static inline T kiln_truncdiv_int(T a, T b) {
  if (b == 0) return 0;
  if (std::numeric_limits<T>::is_signed && b == (T)-1) return kiln_negate_wrapping(a);  // uint8's 255 is not -1
  return (T)(a / b);
}
template <typename T> static inline T kiln_fmod_int(T a, T b) {
  if (b == 0 || (std::numeric_limits<T>::is_signed && b == (T)-1)) return 0;
  return (T)(a %% b);
}
static inline int64_t kiln_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return kiln_negate_wrapping(a);
  int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t kiln_mod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t r = a %% b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T kiln_fmod_float(T a, T b) {
  T r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T kiln_floordiv_float(T a, T b) {
  // ATen's div_floor: exact for representable quotients, a/b when b == 0
  if (b == 0) return a / b;
  T mod = std::fmod(a, b); T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  T fl = std::floor(div); if (div - fl > T(0.5)) fl += 1;
  return div == 0 ? std::copysign(T(0), a / b) : fl;
}
template <typename T> static inline T kiln_ipow(T base, T exp) {
  if (exp < 0) return base == 1 ? 1 : (base == -1 ? ((exp & 1) ? -1 : 1) : 0);
  T r = 1; while (exp) { if (exp & 1) r *= base; exp >>= 1; base *= base; } return r;
}
static inline uint64_t kiln_mix(uint64_t z) {
  // splitmix64 finalizer: a counter-based generator, so every element's draw is independent of threads
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL; z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL; return z ^ (z >> 31);
}
static inline float kiln_rand(int64_t seed, int64_t n) {
  return (float)(kiln_mix((uint64_t)seed * 0x9e3779b97f4a7c15ULL + (uint64_t)n) >> 40) * (1.0f / 16777216.0f);
}
static inline __attribute__((always_inline)) float kiln_erff(float x) {
  // erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (beyond, erf is 1 in float): a relative-error least-squares
  // rational fit made for Kiln (about 6 ulp at worst against double erf; libmvec's erff is <= 1 ulp
  // but costs half again as much, and GELU spends most of its time here). Inline, so loops vectorize.
  // each clamp in the order of vminps / vmaxps with x second: one instruction, and a NaN lane keeps
  // x, runs through the fit and comes out NaN (a NaN test and a blend at the end: GELU over 1M
  // floats at 1 thread ran 0.87x eager, 0.95x without them)
  float c = x > 4.0f ? 4.0f : x;
  c = c < -4.0f ? -4.0f : c;
  float s = c * c;
  float p = -1.336023425636179e-08f;
  p = __builtin_fmaf(p, s, 4.715109374664632e-06f);
  p = __builtin_fmaf(p, s, 0.0003808589606881749f);
  p = __builtin_fmaf(p, s, 0.003856477986800102f);
  p = __builtin_fmaf(p, s, 0.05435400339417203f);
  p = __builtin_fmaf(p, s, 0.1852799983246051f);
  p = __builtin_fmaf(p, s, 1.128379168079161f);
  float q = 6.340348258369064e-05f;
  q = __builtin_fmaf(q, s, 0.0013106910328017061f);
  q = __builtin_fmaf(q, s, 0.015479842987910296f);
  q = __builtin_fmaf(q, s, 0.11401401340851908f);
  q = __builtin_fmaf(q, s, 0.49753352091836056f);
  q = __builtin_fmaf(q, s, 1.0f);
  float y = c * p / q;
  // from 3.8325069 on, erf rounds to exactly 1 in float (libm's erff says so), where the fit stays an
  // ulp or two below: 1 + erf(x) of a large negative x must be 0, or GELU(-104) is -3e-6, not -0
  // (one compare on |c|: a NaN compares false and keeps y, NaN)
  return __builtin_fabsf(c) >= 3.8325069f ? __builtin_copysignf(1.0f, c) : y;
}
static inline __attribute__((always_inline)) float kiln_expf_inline(float x) {
  // exp(x) = 2^n e^r, n = rint(x / ln2), r = x - n ln2 (ln2 split in two so n * hi is exact), e^r =
  // 1 + r + r^2 q(r) with q a relative-error fit made for Kiln: at most 1 ulp from the correctly
  // rounded result, denormals included. Inline, so loops vectorize without a libmvec call (whose
  // register spills cost a GELU backward a third of its time). Below -104 (a masked -inf) it
  // computes on 0 instead: a result underflowing on the way costs a microcode assist. A NaN runs
  // through and comes out NaN. Each clamp is one select whose NaN lane keeps x, in this order: GCC
  // makes vminps and one compare of them, where `x >= -104 ? min(x, 89) : 0` and a NaN test at
  // the end took eight compares and blends per vector (a softmax's exp pass ran 1.3x longer).
  float c = 89.0f < x ? 89.0f : x;
  bool low = x < -104.0f;
  c = low ? 0.0f : c;
  float n = __builtin_rintf(c * 1.44269504088896341f);
  float r = __builtin_fmaf(n, -0.693145751953125f, c);
  r = __builtin_fmaf(n, -1.428606765330187e-06f, r);
  float q = 0.00019790357328020036f;
  q = __builtin_fmaf(q, r, 0.0013944649836048484f);
  q = __builtin_fmaf(q, r, 0.008333496749401093f);
  q = __builtin_fmaf(q, r, 0.04166629537940025f);
  q = __builtin_fmaf(q, r, 0.1666666567325592f);
  q = __builtin_fmaf(q, r, 0.5f);
  float e = __builtin_fmaf(q, r * r, r) + 1.0f;
  // 2^n as two normal powers of two (n runs from -150 to 128), so a denormal result rounds once
  int32_t k = (int32_t)n, k1 = k >> 1, k2 = k - k1;
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &b1, 4);
  __builtin_memcpy(&s2, &b2, 4);
  float y = (e * s1) * s2;
  return low ? 0.0f : y;
}
static inline __attribute__((always_inline)) float kiln_expm1f_inline(float x) {
  // expm1(x): x + x^2 (1/2! + x/3! + ... + x^7/9!) where |x| < 0.5 (the series' tail is under 1e-9
  // of the result there), else exp(x) - 1 (|expm1| >= 0.39 keeps the subtraction within 3 ulp); a
  // zero keeps its sign. Inline, so loops vectorize: libmvec's AVX2 expm1f ran an ELU over 12800
  // floats 1.7x longer than eager's. Infinities and NaN go through the exp side.
  float p = 2.7557319e-06f;
  p = __builtin_fmaf(p, x, 2.4801587e-05f);
  p = __builtin_fmaf(p, x, 1.9841270e-04f);
  p = __builtin_fmaf(p, x, 1.3888889e-03f);
  p = __builtin_fmaf(p, x, 8.3333333e-03f);
  p = __builtin_fmaf(p, x, 4.1666667e-02f);
  p = __builtin_fmaf(p, x, 1.6666667e-01f);
  p = __builtin_fmaf(p, x, 0.5f);
  float small = __builtin_fmaf(p, x * x, x);
  float big = kiln_expf_inline(x) - 1.0f;
  float y = __builtin_fabsf(x) < 0.5f ? small : big;
  return x == 0.0f ? x : y;
}
// c ? a : b as a bit blend of two computed values, for a select whose arm calls a vector math
// function: from `?:` GCC sinks the call into a branch, and a loop with a call in a branch does not
// vectorize (softplus over 16K floats ran 4x eager's time, each lane a whole libmvec call)
template <typename T, typename U> static inline __attribute__((always_inline)) T kiln_blend(bool c, T a, T b) {
  U ua, ub; __builtin_memcpy(&ua, &a, sizeof(T)); __builtin_memcpy(&ub, &b, sizeof(T));
  U m = -(U)c, r = (ua & m) | (ub & ~m); T y; __builtin_memcpy(&y, &r, sizeof(T)); return y;
}
// Float -> integer as ATen's CPU kernels convert (c10's static_cast, through int64 for uint8): C++
// leaves a value out of the target's range undefined (a constant folded by the compiler saturates,
// the same conversion at run time does not), so the rule is spelled out. On x86-64 a truncating
// conversion of NaN or of a value out of range gives the type's minimum; int8 and int16 keep the
// low bits of the int32 conversion, uint8 those of the int64 one. Elsewhere (AArch64) conversions
// saturate and NaN gives 0.
// `inside` is whether x truncates to a value of the type (false for NaN)
#if defined(__x86_64__) || defined(__i386__)
#define DEFINE_KILN_TO_INT(T, F, inside) static inline T kiln_to_##T(F x) { \
  return (inside) ? (T)x : std::numeric_limits<T>::min(); }
#else
#define DEFINE_KILN_TO_INT(T, F, inside) static inline T kiln_to_##T(F x) { \
  return (inside) ? (T)x : x != x ? T(0) : x < 0 ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max(); }
#endif
DEFINE_KILN_TO_INT(int32_t, float, x >= -2147483648.0f && x < 2147483648.0f)
DEFINE_KILN_TO_INT(int32_t, double, x > -2147483649.0 && x < 2147483648.0)
DEFINE_KILN_TO_INT(int64_t, float, x >= -9223372036854775808.0f && x < 9223372036854775808.0f)
DEFINE_KILN_TO_INT(int64_t, double, x >= -9223372036854775808.0 && x < 9223372036854775808.0)
#undef DEFINE_KILN_TO_INT
static inline float kiln_bf16_to_float(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint16_t kiln_float_to_bf16(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  if (f != f) return 0x7fc0;
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);  // round to nearest even, as c10::BFloat16
}
%s"""
RANDN = r"""static inline float kiln_randn(int64_t seed, int64_t n) {
  float u1 = 1.0f - kiln_rand(seed, 2 * n), u2 = kiln_rand(seed ^ 0x5bd1e995, 2 * n + 1);
  return std::sqrt(-2.0f * kiln_logf(u1)) * kiln_cosf(6.2831853071795864f * u2);
}
"""
# ATen's CPU softmax of a half type along another dim than the last walks each thread's share of the
# (outer x inner) positions in vectors of `step` lanes, keeping the exponentials in float and rounding
# once; a share's positions that do not fill a vector within one row run scalar, rounding the
# exponential to the half type first. The shares are ATen's parallel_for with grain 0: all positions
# cut evenly over the thread count, which is torch's (kiln_all_threads, the runtime keeps it so).
VECTOR_LANE = r"""static inline bool kiln_aten_vector_lane(int64_t p, int64_t row, int64_t total, int64_t step) {
  int64_t threads = kiln_all_threads();
  int64_t share = (total + threads - 1) / threads;
  int64_t share_start = p / share * share, row_start = p / row * row;
  int64_t start = share_start > row_start ? share_start : row_start;
  int64_t end = share_start + share < row_start + row ? share_start + share : row_start + row;
  return p - start < (end - start) / step * step;
}
"""
_MATH_NAMES = frozenset(f"{n}{s}" for n in (*MATH, *MATH2) for s in ("f", "")) - {"erff"}


def prelude(kernels: str) -> str:
    """What a translation unit holds before its kernels: helpers, and the math functions (and the
    normal sampler) that `kernels` call."""
    used = set(re.findall(r"kiln_(\w+)\(", kernels)) & _MATH_NAMES
    randn = "kiln_randn(" in kernels
    if randn:
        used |= {"logf", "cosf"}
    lanes = VECTOR_LANE if "kiln_aten_vector_lane(" in kernels else ""
    return PRELUDE_TEMPLATE % (math_prelude(used) + "\n" + (RANDN if randn else "") + lanes) + "\n" + CHECKS_PRELUDE


PRELUDE = prelude("")  # the helpers alone


def cexpr(e: sympy.Expr) -> str:
    """An index expression in C (int64 arithmetic), by kiln.symbolic's one printer."""
    return render_c(sympy.sympify(e))


def _float_fn(name: str, dtype: torch.dtype) -> str:
    return f"kiln_{name}f" if dtype == torch.float32 else f"kiln_{name}"


INT_TYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


# ----------------------------------------------------------------------------- the op table

RENDER = RenderTable()
renders = RENDER.renders


def _ctype(v: Op) -> str:
    """The C type an op computes in: its argument dtype's ("float" for one C has no type for)."""
    return CTYPE.get(arg_dtype(v), "float")


def _is_float(v: Op) -> bool:
    return arg_dtype(v).is_floating_point


@renders(*(name for name in MATH if name not in ("erf", "exp", "expm1")))
def _math(v: Op, a: Sequence[str]) -> str:
    if _is_float(v):
        return f"{_float_fn(v.name, arg_dtype(v))}({a[0]})"
    return f"{_float_fn(v.name, torch.float32)}((float){a[0]})"  # integers: float math


@renders("erf")
def _erf(v: Op, a: Sequence[str]) -> str:
    if arg_dtype(v) == torch.float64:
        return _math(v, a)
    # float (half types compute in float) and integers: the prelude's inline kiln_erff
    return f"kiln_erff({a[0]})" if _is_float(v) else f"kiln_erff((float){a[0]})"


@renders("exp")
def _exp(v: Op, a: Sequence[str]) -> str:
    if arg_dtype(v) not in (torch.float32, *INT_TYPES):
        return _math(v, a)
    # where kiln_expf would run: the prelude's inline kiln_expf_inline
    return f"kiln_expf_inline({a[0]})" if _is_float(v) else f"kiln_expf_inline((float){a[0]})"


@renders("expm1")
def _expm1(v: Op, a: Sequence[str]) -> str:
    if arg_dtype(v) not in (torch.float32, *INT_TYPES):
        return _math(v, a)
    return f"kiln_expm1f_inline({a[0]})" if _is_float(v) else f"kiln_expm1f_inline((float){a[0]})"


INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "bitwise_and": "&", "bitwise_or": "|",
         "bitwise_xor": "^", "lshift": "<<", "rshift": ">>", "eq": "==", "ne": "!=", "lt": "<",
         "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||"}


@renders(*INFIX)
def _infix(v: Op, a: Sequence[str]) -> str:
    if v.name == "truediv" and not _is_float(v):  # C's truncating division, without its traps
        return f"kiln_truncdiv_int<{_ctype(v)}>({a[0]}, {a[1]})"
    if arg_dtype(v) == torch.bool and v.name in ("add", "mul"):
        return f"({a[0]} {'||' if v.name == 'add' else '&&'} {a[1]})"
    return f"({a[0]} {INFIX[v.name]} {a[1]})"


# float (computed as float or double) -> integer through the prelude's kiln_to_int32_t/int64_t, the
# narrow types keeping the low bits as ATen's conversions do (see the prelude)
FLOAT_TO_INT = {torch.int64: "kiln_to_int64_t({})", torch.int32: "kiln_to_int32_t({})",
                torch.int16: "static_cast<int16_t>(kiln_to_int32_t({}))",
                torch.int8: "static_cast<int8_t>(kiln_to_int32_t({}))",
                torch.uint8: "static_cast<uint8_t>(kiln_to_int64_t({}))"}


@renders("to_dtype")
def _to_dtype(v: Op, a: Sequence[str]) -> str:
    target = v.param
    assert isinstance(target, torch.dtype)
    if target == torch.bool:
        return f"({a[0]} != 0)"
    # a half type computes in float but must round to its own precision here (through float,
    # as c10's conversions do): x.half().float() is not x
    if target == torch.float16:
        return f"static_cast<float>(static_cast<_Float16>(static_cast<float>({a[0]})))"
    if target == torch.bfloat16:
        return f"kiln_bf16_to_float(kiln_float_to_bf16(static_cast<float>({a[0]})))"
    if _is_float(v) and target in FLOAT_TO_INT:
        return FLOAT_TO_INT[target].format(a[0])
    return f"static_cast<{CTYPE[compute(target)]}>({a[0]})"


@renders("neg")
def _neg(v: Op, a: Sequence[str]) -> str:
    return f"(-{a[0]})"


@renders("abs")
def _abs(v: Op, a: Sequence[str]) -> str:
    if _is_float(v):
        return f"std::abs({a[0]})"
    return a[0] if arg_dtype(v) == torch.bool else f"({a[0]} < 0 ? -{a[0]} : {a[0]})"


@renders("sqrt")
def _sqrt(v: Op, a: Sequence[str]) -> str:
    return f"std::sqrt({a[0]})"


@renders("rsqrt")
def _rsqrt(v: Op, a: Sequence[str]) -> str:
    return f"({_ctype(v)}(1) / std::sqrt({a[0]}))"


@renders("sigmoid")
def _sigmoid(v: Op, a: Sequence[str]) -> str:
    T = _ctype(v)
    return f"({T}(1) / ({T}(1) + {'kiln_expf_inline' if arg_dtype(v) == torch.float32 else 'kiln_exp'}(-{a[0]})))"


@renders("reciprocal")
def _reciprocal(v: Op, a: Sequence[str]) -> str:
    return f"({_ctype(v)}(1) / {a[0]})"


ROUNDING = {"floor": "std::floor", "ceil": "std::ceil", "trunc": "std::trunc", "round": "std::nearbyint"}


@renders(*ROUNDING)
def _rounding(v: Op, a: Sequence[str]) -> str:
    return f"{ROUNDING[v.name]}({a[0]})" if _is_float(v) else a[0]


@renders("frac")
def _frac(v: Op, a: Sequence[str]) -> str:
    return f"({a[0]} - std::trunc({a[0]}))"


@renders("lgamma")
def _lgamma(v: Op, a: Sequence[str]) -> str:
    return f"std::lgamma({a[0]})"


@renders("sign")
def _sign(v: Op, a: Sequence[str]) -> str:
    T = _ctype(v)
    return f"{T}(({T}(0) < {a[0]}) - ({a[0]} < {T}(0)))"  # sign(NaN) is 0 in ATen


@renders("relu")
def _relu(v: Op, a: Sequence[str]) -> str:
    return f"({a[0]} < 0 ? {_ctype(v)}(0) : {a[0]})"  # keeps NaN and -0.0, as clamp_min does


@renders("bitwise_not")
def _bitwise_not(v: Op, a: Sequence[str]) -> str:
    return f"(!{a[0]})" if arg_dtype(v) == torch.bool else f"(~{a[0]})"


@renders("isnan", "isinf", "isfinite", "signbit")
def _predicate(v: Op, a: Sequence[str]) -> str:
    x = a[0]
    if v.name == "isnan":
        return f"({x} != {x})" if _is_float(v) else "false"
    if v.name == "isinf":
        return f"(std::abs({x}) == std::numeric_limits<{_ctype(v)}>::infinity())" if _is_float(v) else "false"
    if v.name == "isfinite":
        return f"({x} - {x} == 0)" if _is_float(v) else "true"
    return f"std::signbit({x})" if _is_float(v) else f"({x} < 0)"


@renders("logical_not")
def _logical_not(v: Op, a: Sequence[str]) -> str:
    return f"(!{a[0]})"


@renders("logical_xor")
def _logical_xor(v: Op, a: Sequence[str]) -> str:
    return f"(bool({a[0]}) != bool({a[1]}))"


# per division op: its float rendering and its integer one ({T} the C type); integer division by
# zero: ATen raises, so the kernel records it (kiln.lower.checks) and yields 0
DIVISION = {"floordiv": ("kiln_floordiv_float({x}, {y})", "{T}(kiln_floordiv({x}, {y}))"),
            "truncdiv": ("std::trunc({x} / {y})", "kiln_truncdiv_int<{T}>({x}, {y})"),
            "mod": ("kiln_fmod_float({x}, {y})", "{T}(kiln_mod({x}, {y}))"),
            "fmod": ("std::fmod({x}, {y})", "kiln_fmod_int<{T}>({x}, {y})")}


@renders(*DIVISION)
def _division(v: Op, a: Sequence[str]) -> str:
    floating, integer = DIVISION[v.name]
    if _is_float(v):
        return floating.format(x=a[0], y=a[1])
    T = _ctype(v)
    return guard_divisor(v, a, T, integer.format(x=a[0], y=a[1], T=T))


@renders("index_ok")
def _index_ok(v: Op, a: Sequence[str]) -> str:
    return render_index_ok(v, list(a))


@renders("pow")
def _pow(v: Op, a: Sequence[str]) -> str:
    if _is_float(v):
        return f"{_float_fn('pow', arg_dtype(v))}({a[0]}, {a[1]})"
    return f"kiln_ipow<{_ctype(v)}>({a[0]}, {a[1]})"


@renders("maximum", "minimum", "fmax", "fmin")
def _extremum(v: Op, a: Sequence[str]) -> str:
    x, y = a
    pick = f"({x} {'<' if v.name in ('maximum', 'fmax') else '>'} {y} ? {y} : {x})"
    if not _is_float(v):
        return pick
    if v.name in ("maximum", "minimum"):  # NaN wins; ties (-0.0 vs 0.0) return the first operand, as ATen's kernels do
        return f"({x} != {x} ? {x} : ({y} != {y} ? {y} : {pick}))"
    return f"({x} != {x} ? {y} : ({y} != {y} ? {x} : {pick}))"  # NaN loses


@renders("atan2", "hypot")
def _math2(v: Op, a: Sequence[str]) -> str:
    return f"{_float_fn(v.name, arg_dtype(v))}({a[0]}, {a[1]})"


@renders("copysign")
def _copysign(v: Op, a: Sequence[str]) -> str:
    return f"std::copysign({a[0]}, {a[1]})"


def calls_math(u: Value) -> bool:
    """Whether `u` renders as a call to one of the prelude's vector math functions."""
    return isinstance(u, Op) and bool(set(re.findall(r"kiln_(\w+)\(", RENDER[u.name](u, ["a"] * len(u.args))))
                                      & _MATH_NAMES)


@renders("where")
def _where(v: Op, a: Sequence[str]) -> str:
    if v.dtype in (torch.float32, torch.float64) and any(calls_math(u) for arm in v.args[1:] for u in walk(arm)):
        bits = "uint32_t" if v.dtype == torch.float32 else "uint64_t"
        return f"kiln_blend<{CTYPE[v.dtype]}, {bits}>({a[0]}, {a[1]}, {a[2]})"  # the prelude says why
    return f"({a[0]} ? {a[1]} : {a[2]})"


@renders("aten_vector_lane")
def _aten_vector_lane(v: Op, a: Sequence[str]) -> str:
    assert isinstance(v.param, int), v.param
    return f"kiln_aten_vector_lane({a[0]}, {a[1]}, {a[2]}, {v.param})"


@renders("rand", "randn")
def _random(v: Op, a: Sequence[str]) -> str:
    return f"{CTYPE[v.dtype]}(kiln_{v.name}(seed, {a[0]}))"


def compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ----------------------------------------------------------------------------- bodies

class CppBodyWriter(BodyWriter):
    """Emits C++ statements for body values with common-subexpression elimination. `scratch` maps a
    scratch buffer to the substitution that drops the outer variables (its one row), or to the C
    place of the current point's slot (a tile's scratch, a row kept in the output: read only where
    it was written)."""

    RENDER = RENDER

    def __init__(self, storage: dict[str, torch.dtype], sub: dict, locals_: dict[tuple[str, sympy.Expr], str],
                 counter: list[int], scratch: dict | None = None):
        super().__init__(storage, sub, locals_, counter)
        self.scratch = scratch or {}
        self.guard: str | None = None  # a mask every load of this writer tests first (_guarded)
        self.guard_vars: frozenset = frozenset()  # the kernel variables that mask depends on

    def print_index(self, e: sympy.Expr) -> str:
        return cexpr(e)

    def declaration(self, name: str, text: str, dtype: torch.dtype) -> str:
        return f"{CTYPE[compute(dtype)]} {name} = {text};"

    def index_value(self, v: Index) -> str:
        # parenthesized: the text is spliced into the op that reads it (`t0 * (s0 + 1)`)
        text = self.index(v.expr)
        return text if text.isidentifier() or text.lstrip("-").isdigit() else f"({text})"

    def load(self, v: Load, key: sympy.Expr) -> str:
        place = self.scratch.get(v.buffer)
        if isinstance(place, str):  # the current point's slot: a tile's scratch, a row kept in the output
            raw = place
        else:
            if place is not None:
                key = sympy.expand(key.xreplace(place))
            raw = f"{v.buffer}[{cexpr(key)}{'' if v.extra is None else f' + {self.value(v.extra)}'}]"
        if self.guard is not None and (v.extra is not None or key.free_symbols & self.guard_vars):
            raw = f"({self.guard} ? {raw} : 0)"
        st = self.storage[v.buffer]
        raw = f"kiln_bf16_to_float({raw})" if st == torch.bfloat16 else (f"(float){raw}" if st == torch.float16 else raw)
        return self.tmp(raw, v.dtype)

    def masked(self, v: Masked) -> str:
        # each side is evaluated only where it is taken: a concatenation's part may load with
        # an index that is out of range (and fails its check) at the other parts' positions
        mask = self.value(v.mask)
        if _speculable(v.body) and _speculable(v.other):
            # both sides on every lane, each reading memory only where it is taken: the parts of a
            # concatenation (masks within masks) as one select chain GCC vectorizes, where the
            # called-in-place lambda of the other side kept the loop scalar (a cat of three
            # 512x256 matrices ran at 0.56x eager's speed)
            where = self._variables(v.mask)
            return self.tmp(f"{mask} ? {self._guarded(v.body, mask, where)} : "
                            f"{self._guarded(v.other, f'!{mask}', where)}", v.dtype)
        if _speculable(v.body):
            return self.tmp(f"{mask} ? {self._guarded(v.body, mask, self._variables(v.mask))} : "
                            f"{self._branch(v.other)}", v.dtype)
        return self.tmp(f"{mask} ? {self._branch(v.body)} : {self._branch(v.other)}", v.dtype)

    def _variables(self, v: Value) -> frozenset:
        """The kernel variables a value depends on (through its indices and the indices it loads at)."""
        found: set = set()
        for n in walk(v):
            if isinstance(n, Index):
                found |= self.place(n.expr).free_symbols
            elif isinstance(n, Load):
                found |= self.place(n.index).free_symbols
        return frozenset(found)

    def _guarded(self, v: Value, mask: str, mask_vars: frozenset) -> str:
        """`v` computed on every lane, each of its loads reading memory only where `mask` holds (0
        elsewhere): GCC vectorizes that (masked loads, then a select), but not a conditional lambda
        call (a zero-padded copy of a SiLU output for a depthwise convolution ran 3.5x slower).
        A load whose position depends on none of the variables the mask does (a BatchNorm's
        per-channel weight inside a zero-padded NHWC copy, whose mask is over rows and columns)
        reads where it reads on the lanes the mask keeps, so it is not guarded: GCC vectorizes no
        loop with a masked load whose mask is the same on every lane ("no vectype for MASK_LOAD";
        EfficientNet's padded BatchNorm + SiLU copies ran scalar)."""
        inner = CppBodyWriter(self.storage, self.sub, self.locals, self.counter, self.scratch)
        inner.cache = dict(self.cache)  # what is computed here holds only where the mask does: not shared
        inner.guard = mask if self.guard is None else f"({self.guard} && {mask})"  # within another mask
        inner.guard_vars = mask_vars | self.guard_vars
        result = inner.value(v)
        self.lines.extend(inner.lines)
        return result

    def _branch(self, v: Value) -> str:
        """`v` as an expression whose work runs only when it is evaluated (a lambda called in place);
        values computed inside stay inside, values computed before are reused."""
        inner = CppBodyWriter(self.storage, self.sub, self.locals, self.counter, self.scratch)
        inner.cache = dict(self.cache)
        result = inner.value(v)
        if not inner.lines:
            return result
        return f"[&]() -> {CTYPE[compute(v.dtype)]} {{ {' '.join(inner.lines)} return {result}; }}()"

    def const(self, v: Const) -> str:
        if v.dtype == torch.bool:
            return "true" if v.value else "false"
        T = CTYPE[compute(v.dtype)]
        if v.dtype.is_floating_point:
            x = float(v.value)
            if x != x:
                return f"std::numeric_limits<{T}>::quiet_NaN()"
            if x in (float("inf"), float("-inf")):
                return f"{'-' if x < 0 else ''}std::numeric_limits<{T}>::infinity()"
            return f"{T}({x!r})"
        if int(v.value) == -(2 ** 63):
            return "std::numeric_limits<int64_t>::min()"
        return f"{T}({int(v.value)}LL)"

    def store(self, buffer: str, index: sympy.Expr, value: str, mode: str | None = None, extra: str = "",
              atomic: bool = True) -> None:
        st = self.storage[buffer]
        val = _to_half(st, value)
        where = self.place(index)
        place = self.scratch.get(buffer)
        if place is not None and not isinstance(place, str):
            where = sympy.expand(where.xreplace(place))
        target = place if isinstance(place, str) else f"{buffer}[{cexpr(where)}{extra}]"
        if mode == "add" and st in (torch.bfloat16, torch.float16):
            # the addend and each sum round to the half type, one element after another, as ATen's
            # serial loops add (index_put with accumulate, index_add): the sum of a half word and a
            # float would add bit patterns (bfloat16 lives in a uint16_t)
            if atomic:
                raise ValueError("an add into a half-typed buffer runs on one thread")
            load = (lambda x: f"kiln_bf16_to_float({x})") if st == torch.bfloat16 else (lambda x: f"(float){x}")
            self.lines.append(f"{target} = {_to_half(st, load(target) + ' + ' + load(_to_half(st, value)))};")
            return
        if mode == "add":
            if atomic:  # only a loop that runs on one thread may add without it
                self.lines.append("#pragma omp atomic")
            self.lines.append(f"{target} += {val};")
        else:
            self.lines.append(f"{target} = {val};")


# ops that record an error or draw random numbers: never run on lanes a mask leaves out
_UNSPECULABLE = frozenset({"index_ok", "rand", "randn"})


_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"})


def _speculable(v: Value) -> bool:
    """Whether a masked value may be computed on every lane, its loads guarded (_guarded): plain
    loads and floating-point arithmetic only (no error checks, no integer division that could
    trap on a lane's made-up operand, no indirect load whose index comes from such a lane)."""
    return all(isinstance(n, (Const, Index, Masked)) or (isinstance(n, Load) and n.extra is None)
               or (isinstance(n, Op) and n.dtype.is_floating_point and n.name not in _UNSPECULABLE)
               or (isinstance(n, Op) and n.name in _COMPARISONS)  # a mask within the value: never traps
               for n in walk(v))


def _to_half(storage: torch.dtype, value: str) -> str:
    """C++ of a float `value` stored as `storage` (rounded to nearest even for the half types)."""
    if storage == torch.bfloat16:
        return f"kiln_float_to_bf16({value})"
    return f"(_Float16)({value})" if storage == torch.float16 else value
