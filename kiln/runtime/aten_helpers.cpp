// C++ helpers over ATen shared by every graph's compiled native wrapper
// (kiln.lower.codegen.native_wrapper pastes this file into its prelude) and by the boundary
// extension's plan runner (plan_runner.cpp, which boundary.source() splices in after it): one text,
// so a plan and a compiled wrapper floor-divide sizes and re-lay out inputs the same way.
// Includes: ATen's Tensor, empty_strided, empty, arange; <algorithm>, <utility>, <vector>.
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
