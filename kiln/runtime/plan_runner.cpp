// The plan runner of the boundary extension: not a translation unit of its own. kiln.runtime.boundary.source
// splices it into boundary.cpp where that file says, after its includes; the two are built, hashed and
// cached as one source.

// ---------------------------------------------------------------------------------------------------
// The plan runner (kiln.runtime.plan): a graph's wrapper as data, interpreted here, so that a graph
// runs natively with no C++ compiled for it. kiln.lower.codegen.plan writes the plan from the same
// decisions as the per-graph C++ wrapper (memory plan, relayouts, views, kernel order, externs, frees,
// outputs, checks): a stream of int64 words (the opcodes below), beside tables of doubles, strings,
// dtypes, operators (resolved through the dispatcher once, when the plan is made) and the messages
// of the kernels' checks. Kernels are called through their `kiln_plan_<name>(const int64_t*)` entry
// (kiln.lower.codegen.cpp_kernel.plan_entries). Every index read from the stream is checked: a
// malformed plan raises, it never reads outside its tables.
namespace kiln_plan {

enum Op : int64_t {
  NARGS = 1, ARG_TENSOR, ARG_INT, ARG_FLOAT, SYM_INT, SYM_SIZE, SYM_STRIDE, SYM_FLOAT, SET, TAKE, RELAYOUT,
  CONST, SEED, ALLOC, ALIAS, VIEW, RESET, KERNEL, EXTERN, BIND_SIZE, OUT, CHECK_STRIDES, CHECK_RESULT,
  FOLD, FOLD_DONE
};
// tokens of an integer expression (reverse Polish)
enum Tok : int64_t {
  T_CONST = 0, T_REG, T_ADD, T_MUL, T_FLOORDIV, T_MOD, T_NEG, T_MIN, T_MAX, T_ABS, T_DIV, T_REM,
  T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_AND, T_OR, T_NOT, T_SELECT
};
// kinds of an operator's argument or a graph's output
enum Val : int64_t {
  V_NONE = 0, V_INT, V_DOUBLE, V_FREG, V_BOOL, V_TENSOR, V_INT_LIST, V_DOUBLE_LIST, V_BOOL_LIST, V_TENSOR_LIST,
  V_OPT_TENSOR_LIST, V_DEVICE, V_STRING, V_DTYPE, V_LAYOUT, V_MEMORY_FORMAT, V_OPT_SCALAR_LIST
};
// a kernel's argument
enum Arg : int64_t { A_PTR = 0, A_INT, A_FREG, A_ERROR };

struct Site { int64_t kind; std::vector<std::string> pieces; };  // "\x01" the value, "\x02" the bound

struct Plan {
  std::vector<int64_t> words;
  std::vector<double> doubles;
  std::vector<std::string> strings;
  std::vector<at::ScalarType> dtypes;
  std::vector<c10::OperatorHandle> ops;
  std::map<int64_t, Site> sites;
  int64_t nslots = 0, nregs = 0, nfregs = 0;
  // the FOLD instructions' memos (aten_helpers.cpp), made on first use: the plan is shared by calls
  // on several threads, and its tables are read-only
  mutable std::mutex memo_mutex;
  mutable std::vector<std::unique_ptr<KilnFoldMemo>> memos;
  KilnFoldMemo& memo(int64_t m) const {
    if (m < 0 || m >= (int64_t(1) << 16)) throw std::out_of_range("kiln plan: a fold memo index outside its range");
    std::lock_guard<std::mutex> guard(memo_mutex);
    if (static_cast<size_t>(m) >= memos.size()) memos.resize(static_cast<size_t>(m) + 1);
    if (!memos[static_cast<size_t>(m)]) memos[static_cast<size_t>(m)] = std::make_unique<KilnFoldMemo>();
    return *memos[static_cast<size_t>(m)];
  }
};

// kiln_floordiv, kiln_mod, kiln_may_overlap, kiln_relayout: aten_helpers.cpp, spliced in before this file

struct Failure { int64_t kind; std::string message; };

// one call's state
struct Frame {
  const Plan& p;
  c10::IValue* args;
  int64_t nargs;
  // small vectors: a call allocates nothing of its own on the heap for a graph of usual size
  c10::SmallVector<at::Tensor, 32> slots;
  c10::SmallVector<int64_t, 16> regs;
  c10::SmallVector<double, 4> fregs;
  size_t pc = 0;
  int64_t err[3] = {0, 0, 0};
  c10::SmallVector<int64_t, 16> stack;

  Frame(const Plan& plan, c10::IValue* a, int64_t n)
      : p(plan), args(a), nargs(n), slots(plan.nslots), regs(plan.nregs), fregs(plan.nfregs) {}

  int64_t next() {
    if (pc >= p.words.size()) throw std::out_of_range("kiln plan: read past its end");
    return p.words[pc++];
  }
  int64_t index(int64_t bound) {
    int64_t i = next();
    if (i < 0 || i >= bound) throw std::out_of_range("kiln plan: an index outside its table");
    return i;
  }
  at::Tensor& slot() { return slots[index(static_cast<int64_t>(slots.size()))]; }
  c10::IValue& arg() { return args[index(nargs)]; }

  int64_t expr() {
    int64_t n = next();
    stack.clear();
    auto pop = [&]() {
      if (stack.empty()) throw std::out_of_range("kiln plan: an expression pops an empty stack");
      int64_t v = stack.back(); stack.pop_back(); return v;
    };
    for (int64_t k = 0; k < n; ++k) {
      int64_t t = next();
      if (t == T_CONST) { stack.push_back(next()); continue; }
      if (t == T_REG) { stack.push_back(regs[index(static_cast<int64_t>(regs.size()))]); continue; }
      if (t == T_NEG) { stack.push_back(-pop()); continue; }
      if (t == T_ABS) { int64_t a = pop(); stack.push_back(a < 0 ? -a : a); continue; }
      if (t == T_NOT) { stack.push_back(!pop()); continue; }
      if (t == T_SELECT) { int64_t o = pop(), th = pop(), c = pop(); stack.push_back(c ? th : o); continue; }
      int64_t b = pop(), a = pop();
      switch (t) {
        case T_ADD: stack.push_back(a + b); break;
        case T_MUL: stack.push_back(a * b); break;
        case T_FLOORDIV: stack.push_back(kiln_floordiv(a, b)); break;
        case T_MOD: stack.push_back(kiln_mod(a, b)); break;
        case T_MIN: stack.push_back(std::min(a, b)); break;
        case T_MAX: stack.push_back(std::max(a, b)); break;
        case T_DIV: stack.push_back(b == 0 ? 0 : a / b); break;
        case T_REM: stack.push_back(b == 0 ? 0 : a % b); break;
        case T_EQ: stack.push_back(a == b); break;
        case T_NE: stack.push_back(a != b); break;
        case T_LT: stack.push_back(a < b); break;
        case T_LE: stack.push_back(a <= b); break;
        case T_GT: stack.push_back(a > b); break;
        case T_GE: stack.push_back(a >= b); break;
        case T_AND: stack.push_back(a && b); break;
        case T_OR: stack.push_back(a || b); break;
        default: throw std::out_of_range("kiln plan: an unknown expression token");
      }
    }
    if (stack.size() != 1) throw std::out_of_range("kiln plan: an expression leaves no single value");
    return stack.back();
  }
  using Ints = c10::SmallVector<int64_t, 8>;
  Ints exprs() {
    int64_t n = next();
    Ints out;
    for (int64_t k = 0; k < n; ++k) out.push_back(expr());
    return out;
  }
  // a tensor reference: a slot, or a view of it (sizes, strides, an offset added to its own)
  at::Tensor tensor() {
    at::Tensor& base = slot();
    int64_t how = next();
    if (how == 0) return base;
    Ints sizes = exprs(), strides = exprs();
    if (how == 1) return base.as_strided(sizes, strides);
    int64_t offset = expr();
    return base.as_strided(sizes, strides, base.storage_offset() + offset);
  }
  c10::IValue value() {
    int64_t kind = next();
    switch (kind) {
      case V_NONE: return c10::IValue();
      case V_INT: return c10::IValue(expr());
      case V_DOUBLE: return c10::IValue(p.doubles.at(static_cast<size_t>(next())));
      case V_FREG: return c10::IValue(fregs.at(static_cast<size_t>(next())));
      case V_BOOL: return c10::IValue(next() != 0);
      case V_TENSOR: return c10::IValue(tensor());
      case V_INT_LIST: { Ints xs = exprs(); return c10::IValue(std::vector<int64_t>(xs.begin(), xs.end())); }
      case V_OPT_SCALAR_LIST: {  // each item a value of its own (none, an int, a double or a bool)
        int64_t n = next();
        c10::impl::GenericList xs(c10::OptionalType::create(c10::NumberType::get()));
        for (int64_t k = 0; k < n; ++k) xs.push_back(value());
        return c10::IValue(xs);
      }
      case V_DOUBLE_LIST: {
        int64_t n = next();
        std::vector<double> xs;
        for (int64_t k = 0; k < n; ++k) xs.push_back(p.doubles.at(static_cast<size_t>(next())));
        return c10::IValue(xs);
      }
      case V_BOOL_LIST: {
        int64_t n = next();
        c10::List<bool> xs;
        for (int64_t k = 0; k < n; ++k) xs.push_back(next() != 0);
        return c10::IValue(xs);
      }
      case V_TENSOR_LIST: {
        int64_t n = next();
        std::vector<at::Tensor> xs;
        for (int64_t k = 0; k < n; ++k) xs.push_back(tensor());
        return c10::IValue(xs);
      }
      case V_OPT_TENSOR_LIST: {
        int64_t n = next();
        c10::List<std::optional<at::Tensor>> xs;
        for (int64_t k = 0; k < n; ++k) {
          if (next()) xs.push_back(tensor()); else xs.push_back(std::nullopt);
        }
        return c10::IValue(xs);
      }
      case V_DEVICE: return c10::IValue(c10::Device(p.strings.at(static_cast<size_t>(next()))));
      case V_STRING: return c10::IValue(p.strings.at(static_cast<size_t>(next())));
      case V_DTYPE: return c10::IValue(p.dtypes.at(static_cast<size_t>(next())));
      case V_LAYOUT: next(); return c10::IValue(at::kStrided);
      case V_MEMORY_FORMAT: {
        int64_t f = next();
        at::MemoryFormat m = f == 0 ? at::MemoryFormat::Contiguous : f == 1 ? at::MemoryFormat::Preserve
            : f == 2 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
        return c10::IValue(m);
      }
      default: throw std::out_of_range("kiln plan: an unknown value kind");
    }
  }
  std::string site_message(const Site& s) {
    std::string out;
    for (const auto& piece : s.pieces)
      out += piece == "\x01" ? std::to_string(err[1]) : piece == "\x02" ? std::to_string(err[2]) : piece;
    return out;
  }

  // runs the plan; false with `failure` set where the C++ wrapper reports a failed check
  bool run(std::vector<c10::IValue>* outs, void* const* kernels, size_t nkernels,
           const std::vector<c10::IValue>& constants, Failure* failure) {
    c10::SmallVector<int64_t, 16> words;
    std::vector<c10::IValue> boxed;
    while (pc < p.words.size()) {
      int64_t op = next();
      switch (op) {
        case NARGS: {
          int64_t n = next();
          if (nargs != n) {
            *failure = {3, "the compiled graph takes " + std::to_string(n) + " arguments, " + std::to_string(nargs)
                           + " given"};
            return false;
          }
          break;
        }
        case ARG_TENSOR: {
          int64_t at = pc;
          c10::IValue& a = arg();
          if (!a.isTensor()) {
            *failure = {5, "argument " + std::to_string(p.words[at]) + " of the compiled graph is not a tensor"};
            return false;
          }
          break;
        }
        case ARG_INT: {
          int64_t at = pc;
          c10::IValue& a = arg();
          if (a.isBool()) a = int64_t(a.toBool());
          if (!a.isInt()) {
            *failure = {5, "argument " + std::to_string(p.words[at]) + " of the compiled graph is not an int"};
            return false;
          }
          break;
        }
        case ARG_FLOAT: {
          int64_t at = pc;
          c10::IValue& a = arg();
          if (a.isBool()) a = double(a.toBool());
          if (a.isInt()) a = double(a.toInt());
          if (!a.isDouble()) {
            *failure = {5, "argument " + std::to_string(p.words[at]) + " of the compiled graph is not a float"};
            return false;
          }
          break;
        }
        case SYM_INT: { int64_t r = index(p.nregs); regs[r] = arg().toInt(); break; }
        case SYM_SIZE: { int64_t r = index(p.nregs); c10::IValue& a = arg(); regs[r] = a.toTensor().size(next()); break; }
        case SYM_STRIDE: { int64_t r = index(p.nregs); c10::IValue& a = arg(); regs[r] = a.toTensor().stride(next()); break; }
        case SYM_FLOAT: { int64_t r = index(p.nfregs); fregs[r] = arg().toDouble(); break; }
        case SET: { int64_t r = index(p.nregs); regs[r] = expr(); break; }
        case TAKE: { at::Tensor& s = slot(); s = std::move(arg()).toTensor(); break; }
        case RELAYOUT:
        case CHECK_STRIDES: {
          at::Tensor& s = slot();
          Ints strides = exprs();
          if (!s.strides().equals(strides)) s = kiln_relayout(s, strides);
          break;
        }
        case CHECK_RESULT: {  // an extern's result: its dtype and sizes are the fake's, then its strides
          at::Tensor& s = slot();
          const c10::OperatorHandle& handle = p.ops.at(static_cast<size_t>(next()));
          at::ScalarType dtype = p.dtypes.at(static_cast<size_t>(next()));
          bool clean = next() != 0, has_sizes = next() != 0;
          Ints sizes;
          if (has_sizes) sizes = exprs();
          Ints strides = exprs();
          at::IntArrayRef expected(sizes);
          std::string mismatch = kiln_result_mismatch(handle.schema().name(), s, dtype, has_sizes ? &expected : nullptr);
          if (!mismatch.empty()) {
            *failure = {clean ? 6 : 7, std::move(mismatch)};
            return false;
          }
          if (s.dim() && !s.strides().equals(strides)) s = kiln_relayout(s, strides);
          break;
        }
        case CONST: { at::Tensor& s = slot(); s = constants.at(static_cast<size_t>(next())).toTensor(); break; }
        case SEED: {
          int64_t r = index(p.nregs);
          regs[r] = at::randint(-(int64_t(1) << 62), int64_t(1) << 62, {}, at::TensorOptions().dtype(at::kLong))
                        .item<int64_t>();
          break;
        }
        case ALLOC: {
          at::Tensor& s = slot();
          at::ScalarType dtype = p.dtypes.at(static_cast<size_t>(next()));
          Ints sizes = exprs(), strides = exprs();
          s = at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
          break;
        }
        case ALIAS: { at::Tensor& d = slot(); at::Tensor& s = slot(); d = s; break; }
        case VIEW: {
          at::Tensor& d = slot();
          at::Tensor& s = slot();
          Ints sizes = exprs(), strides = exprs();
          d = s.as_strided(sizes, strides);
          break;
        }
        case RESET: slot().reset(); break;
        case KERNEL: {
          int64_t k = index(static_cast<int64_t>(nkernels));
          int64_t n = next();
          words.clear();
          for (int64_t a = 0; a < n; ++a) {
            int64_t kind = next();
            if (kind == A_PTR) {
              words.push_back(reinterpret_cast<int64_t>(slot().data_ptr()));
            } else if (kind == A_INT) {
              words.push_back(expr());
            } else if (kind == A_FREG) {
              double d = fregs.at(static_cast<size_t>(next()));
              int64_t w;
              std::memcpy(&w, &d, sizeof w);
              words.push_back(w);
            } else if (kind == A_ERROR) {
              words.push_back(reinterpret_cast<int64_t>(&err[0]));
            } else {
              throw std::out_of_range("kiln plan: an unknown kernel argument kind");
            }
          }
          reinterpret_cast<void (*)(const int64_t*)>(kernels[k])(words.data());
          if (err[0]) {
            auto found = p.sites.find(err[0]);
            if (found != p.sites.end()) {
              *failure = {found->second.kind, site_message(found->second)};
            } else {
              *failure = {2, "kiln: kernel check " + std::to_string(err[0]) + " failed (value " + std::to_string(err[1])
                             + ", bound " + std::to_string(err[2]) + ")"};
            }
            return false;
          }
          break;
        }
        case EXTERN: {
          const c10::OperatorHandle& handle = p.ops.at(static_cast<size_t>(next()));
          int64_t n = next();
          boxed.clear();
          boxed.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
          for (int64_t a = 0; a < n; ++a) boxed.push_back(value());
          handle.callBoxed(boxed);
          int64_t results = next();
          for (int64_t r = 0; r < results; ++r) {
            at::Tensor& s = slot();
            size_t at = static_cast<size_t>(next());
            int64_t item = next();
            const c10::IValue& v = boxed.at(at);
            s = item < 0 ? v.toTensor() : v.toTensorList().get(static_cast<size_t>(item));
          }
          break;
        }
        case FOLD:  // m, six input slots (-1: none), two result slots, the words to skip on a hit
        case FOLD_DONE: {  // m, the same slots: remember what the EXTERN between them made
          KilnFoldMemo& memo = p.memo(next());
          std::array<at::Tensor, 6> in;
          for (auto& t : in) {
            int64_t s = next();
            if (s >= 0) {
              if (s >= static_cast<int64_t>(slots.size())) throw std::out_of_range("kiln plan: an index outside its table");
              t = slots[static_cast<size_t>(s)];
            }
          }
          at::Tensor& r0 = slot();
          at::Tensor& r1 = slot();
          if (op == FOLD_DONE) {
            kiln_fold_remember(memo, in, r0, r1);
            break;
          }
          int64_t skip = next();
          if (skip < 0 || pc + static_cast<size_t>(skip) > p.words.size()) throw std::out_of_range("kiln plan: a skip past its end");
          if (kiln_fold_hit(memo, in, r0, r1)) pc += static_cast<size_t>(skip);
          break;
        }
        case BIND_SIZE: { int64_t r = index(p.nregs); at::Tensor& s = slot(); regs[r] = s.size(next()); break; }
        case OUT: outs->push_back(value()); break;
        default: throw std::out_of_range("kiln plan: an unknown instruction");
      }
    }
    return true;
  }
};

}  // namespace kiln_plan
