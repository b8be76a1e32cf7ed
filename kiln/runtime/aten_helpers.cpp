// C++ helpers over ATen shared by every graph's compiled native wrapper
// (kiln.lower.codegen.native_wrapper pastes this file into its prelude) and by the boundary
// extension's plan runner (plan_runner.cpp, which boundary.source() splices in after it): one text,
// so a plan and a compiled wrapper floor-divide sizes and re-lay out inputs the same way.
// Includes: ATen's Tensor, empty_strided, empty, arange; <algorithm>, <utility>, <vector> (and <array>,
// <mutex>, <optional> where the fold memo starts).
static inline int64_t kiln_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t kiln_mod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// whether two indices of a layout can meet at one address (kiln.runtime.overlap.may_overlap)
static bool kiln_may_overlap(at::IntArrayRef sizes, at::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (size_t d = 0; d < sizes.size(); d++) {
    if (sizes[d] <= 1) continue;
    if (strides[d] == 0) return true;
    dims.emplace_back(strides[d], sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (const auto& dim : dims) {
    if (dim.first <= reach) return true;
    reach += (dim.second - 1) * dim.first;
  }
  return false;
}
// t with the strides the kernels were compiled for (the Python wrapper's _relayout): t itself where
// only strides of size-1 dims differ; else a copy, into shared addresses too (kiln.runtime.overlap)
static at::Tensor kiln_relayout(const at::Tensor& t, at::IntArrayRef strides) {
  bool same = true;
  for (int64_t d = 0; d < t.dim(); d++) same = same && (t.size(d) == 1 || t.stride(d) == strides[d]);
  if (same) return t;
  if (!kiln_may_overlap(t.sizes(), strides)) {
    at::Tensor out = at::empty_strided(t.sizes(), strides, t.options());
    out.copy_(t);
    return out;
  }
  // a dim of stride 0 holds one value along it: one slice of t gives it
  at::Tensor source = t;
  std::vector<int64_t> sizes = t.sizes().vec();
  int64_t extent = 1;
  for (size_t d = 0; d < sizes.size(); d++) {
    if (strides[d] == 0 && sizes[d] > 1) {
      source = source.narrow(int64_t(d), 0, 1);
      sizes[d] = 1;
    }
    if (sizes[d] == 0) extent = 0;
  }
  for (size_t d = 0; d < sizes.size() && extent; d++) extent += (sizes[d] - 1) * strides[d];
  at::Tensor storage = at::empty({extent}, t.options());
  if (!kiln_may_overlap(sizes, strides)) {
    storage.as_strided(sizes, strides).copy_(source);
  } else {  // each address gets one of the elements that meet there
    at::Tensor where = at::arange(extent, t.options().dtype(at::kLong)).as_strided(sizes, strides).reshape({-1});
    storage.scatter_(0, where, source.reshape({-1}));
  }
  return storage.as_strided(t.sizes(), strides);
}
// whether an extern's result is what its fake tensor promised (dtype, and sizes where `sizes` is given):
// "" if so, else the message of kiln.errors.ExternMismatchError (the Python wrapper's checked_result)
static std::string kiln_result_mismatch(const std::string& op, const at::Tensor& t, at::ScalarType dtype,
                                        const at::IntArrayRef* sizes) {
  if (t.scalar_type() == dtype && (sizes == nullptr || t.sizes().equals(*sizes))) return std::string();
  std::string expected = sizes == nullptr ? std::string("any sizes") : "sizes " + c10::str(*sizes);
  return "kiln internal error: the extern " + op + " returned a " + std::string(c10::toString(t.scalar_type()))
         + " tensor of sizes " + c10::str(t.sizes()) + " where its fake tensor at capture was "
         + std::string(c10::toString(dtype)) + " of " + expected
         + ": a fake (meta) implementation disagrees with the real kernel (for a custom op, check its register_fake)";
}
#include <array>
#include <cstring>
#include <mutex>
#include <optional>
// kiln::fold_conv_bn* remembered at its call site (a compiled wrapper's function-local static, a plan's
// FOLD instruction): the inputs of the last call by identity and the results, so that a call with
// unchanged weights skips the dispatcher and the Python cache check (kiln.runtime.folded_weights),
// ~25 us a convolution. Every reference is weak: a TensorImpl or StorageImpl held weakly keeps
// its address from being reused, so equal pointers are the same live object, and the memo keeps
// neither a freed model's weights nor its folded copies alive (an expired result is a miss).
struct KilnFoldSeen {
  bool defined = false;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> impl;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;
  const void* data = nullptr;
  int64_t version = 0;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<char> bytes;  // the values of a running statistic (below)
};
struct KilnFoldMemo {
  std::mutex mutex;
  bool valid = false;
  std::array<KilnFoldSeen, 6> seen;
  std::array<std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>>, 2> results;
};
// Inputs 4 and 5 are the running mean and variance: eager BatchNorm's train-mode update writes them
// inside ATen's kernel and moves no version counter, so their values are compared too (as
// kiln.runtime.folded_weights.FoldCache does).
static inline bool kiln_fold_statistic(size_t i) { return i == 4 || i == 5; }
// a tensor whose identity, storage and version counter (and values, for a statistic) say whether it changed
static inline bool kiln_fold_memoable(const at::Tensor& t, size_t i) {
  return !t.defined() || (t.layout() == at::kStrided && t.has_storage() && !t.is_inference() &&
                          (!kiln_fold_statistic(i) || t.is_contiguous()));
}
static inline bool kiln_fold_same(const KilnFoldSeen& s, const at::Tensor& t, size_t i) {
  if (!t.defined() || !s.defined) return t.defined() == s.defined;
  return s.impl->_unsafe_get_target() == t.unsafeGetTensorImpl() &&
         s.storage->_unsafe_get_target() == t.storage().unsafeGetStorageImpl() &&
         s.data == t.const_data_ptr() && s.version == t._version() && t.scalar_type() == s.dtype &&
         t.sizes().equals(s.sizes) && t.strides().equals(s.strides) &&
         (!kiln_fold_statistic(i) || (s.bytes.size() == t.nbytes() &&
                                      std::memcmp(s.bytes.data(), t.const_data_ptr(), s.bytes.size()) == 0));
}
// the remembered results when all six inputs are the ones seen last and both results still live
static bool kiln_fold_hit(KilnFoldMemo& memo, const std::array<at::Tensor, 6>& in, at::Tensor& r0, at::Tensor& r1) {
  std::lock_guard<std::mutex> guard(memo.mutex);
  if (!memo.valid) return false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!kiln_fold_same(memo.seen[i], in[i], i)) return false;
  }
  auto a = memo.results[0]->lock(), b = memo.results[1]->lock();
  if (!a || !b) return false;
  r0 = at::Tensor(std::move(a));
  r1 = at::Tensor(std::move(b));
  return true;
}
static void kiln_fold_remember(KilnFoldMemo& memo, const std::array<at::Tensor, 6>& in, const at::Tensor& r0,
                               const at::Tensor& r1) {
  std::lock_guard<std::mutex> guard(memo.mutex);
  memo.valid = false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!kiln_fold_memoable(in[i], i)) return;
  }
  if (!r0.defined() || !r1.defined()) return;
  for (size_t i = 0; i < in.size(); ++i) {
    const at::Tensor& t = in[i];
    KilnFoldSeen& s = memo.seen[i];
    s.defined = t.defined();
    if (!s.defined) continue;
    s.impl.emplace(t.getIntrusivePtr());
    s.storage.emplace(t.storage().getWeakStorageImpl());
    s.data = t.const_data_ptr();
    s.version = t._version();
    s.sizes = t.sizes().vec();
    s.strides = t.strides().vec();
    s.dtype = t.scalar_type();
    const char* data = static_cast<const char*>(t.const_data_ptr());
    if (kiln_fold_statistic(i)) s.bytes.assign(data, data + t.nbytes());
  }
  memo.results[0].emplace(r0.getIntrusivePtr());
  memo.results[1].emplace(r1.getIntrusivePtr());
  memo.valid = true;
}
