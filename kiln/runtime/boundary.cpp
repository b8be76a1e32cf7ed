// The boundary between Python and Kiln's C++ (kiln.runtime.boundary builds and loads it): one small
// CPython extension, built once per torch and Python and cached like any library. It holds
//  - the native wrapper's entry (kiln.runtime.native): a handle (a capsule) holds a graph's C++
//    function, its kernel table and the kernel library's thread-count follower; `call`/`steal` turn
//    Python arguments into c10::IValues, run the graph and wrap its outputs, raising what eager raises;
//    `direct` makes a plain inference graph's whole runtime call one C object (kiln.runtime.aot);
//  - the guard checks (kiln.capture.guards): `tensor_spec`/`tensor_ok`, `same_keys`, `empty_attrs`;
//  - the autograd node of a compiled training graph whose forward is Kiln's kernels only
//    (kiln.runtime.aot): `apply_node` runs the forward and records one C++ node, in place of a
//    Python autograd.Function's context object, PyNode and two Python frames per call.
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/Layout.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/randint.h>
#include <pybind11/pybind11.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

typedef int (*KilnGraph)(c10::IValue*, int64_t, std::vector<c10::IValue>*, void* const*, const c10::IValue*,
                         int64_t*, std::string*);

// kiln: plan_runner.cpp is spliced in here (kiln.runtime.boundary.source; both files are one extension, one cache key)

// the KilnGraph of a plan: the handle's plan runs in place of a compiled graph function
static int kiln_plan_run(const kiln_plan::Plan& plan, c10::IValue* args, int64_t nargs, std::vector<c10::IValue>* outs,
                         void* const* kernels, size_t nkernels, const std::vector<c10::IValue>& constants,
                         int64_t* error_kind, std::string* message) {
  kiln_plan::Frame frame(plan, args, nargs);
  kiln_plan::Failure failure{0, {}};
  if (frame.run(outs, kernels, nkernels, constants, &failure)) return 0;
  *error_kind = failure.kind;
  *message = std::move(failure.message);
  return 1;
}

struct KilnHandle {
  KilnGraph fn;  // the graph's compiled function, or NULL where `plan` runs instead
  std::vector<void*> kernels;  // the kernels (of a plan: their kiln_plan_ entries)
  std::vector<c10::IValue> constants;  // the graph's constant tensors
  PyObject* follow;  // LibraryThreads.follow of the kernel library, or NULL without kernels
  int threads;
  kiln_plan::Plan* plan = nullptr;
};

static void kiln_handle_free(PyObject* capsule) {
  auto* h = static_cast<KilnHandle*>(PyCapsule_GetPointer(capsule, "kiln.native"));
  if (h == nullptr) { PyErr_Clear(); return; }
  Py_XDECREF(h->follow);
  delete h->plan;
  delete h;
}

// make(graph function address, [kernel addresses], [constant tensors], follow or None) -> handle
static PyObject* kiln_make(PyObject*, PyObject* args) {
  unsigned long long fn;
  PyObject* kernels;
  PyObject* constants;
  PyObject* follow;
  if (!PyArg_ParseTuple(args, "KO!O!O", &fn, &PyList_Type, &kernels, &PyList_Type, &constants, &follow))
    return nullptr;
  auto* h = new KilnHandle{reinterpret_cast<KilnGraph>(fn), {}, {}, nullptr, -1};
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(constants); ++i) {
    PyObject* c = PyList_GET_ITEM(constants, i);
    if (!THPVariable_Check(c)) { delete h; PyErr_SetString(PyExc_TypeError, "a constant that is not a tensor"); return nullptr; }
    h->constants.emplace_back(THPVariable_Unpack(c));
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kernels); ++i) {
    unsigned long long p = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(kernels, i));
    if (PyErr_Occurred()) { delete h; return nullptr; }
    h->kernels.push_back(reinterpret_cast<void*>(p));
  }
  if (follow != Py_None) { Py_INCREF(follow); h->follow = follow; }
  PyObject* capsule = PyCapsule_New(h, "kiln.native", kiln_handle_free);
  if (capsule == nullptr) { Py_XDECREF(h->follow); delete h; }
  return capsule;
}

static bool kiln_strings(PyObject* list, std::vector<std::string>& out) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
    const char* text = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i));
    if (text == nullptr) return false;
    out.emplace_back(text);
  }
  return true;
}

// make_plan(words (bytes of int64), [doubles], [strings], [(op name, overload)], [dtypes],
//           [(site, error kind, [pieces])], (slots, int registers, float registers),
//           [kernel entry addresses], [constant tensors], follow or None) -> handle
static PyObject* kiln_make_plan(PyObject*, PyObject* args) {
  PyObject *words, *doubles, *strings, *ops, *dtypes, *sites, *kernels, *constants, *follow;
  long long nslots, nregs, nfregs;
  if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!(LLL)O!O!O", &PyBytes_Type, &words, &PyList_Type, &doubles, &PyList_Type,
                        &strings, &PyList_Type, &ops, &PyList_Type, &dtypes, &PyList_Type, &sites, &nslots, &nregs,
                        &nfregs, &PyList_Type, &kernels, &PyList_Type, &constants, &follow))
    return nullptr;
  if (PyBytes_GET_SIZE(words) % 8 != 0 || nslots < 0 || nregs < 0 || nfregs < 0) {
    PyErr_SetString(PyExc_ValueError, "make_plan: a malformed plan");
    return nullptr;
  }
  auto plan = std::make_unique<kiln_plan::Plan>();
  plan->words.resize(static_cast<size_t>(PyBytes_GET_SIZE(words) / 8));
  std::memcpy(plan->words.data(), PyBytes_AS_STRING(words), static_cast<size_t>(PyBytes_GET_SIZE(words)));
  plan->nslots = nslots; plan->nregs = nregs; plan->nfregs = nfregs;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(doubles); ++i) {
    double d = PyFloat_AsDouble(PyList_GET_ITEM(doubles, i));
    if (d == -1.0 && PyErr_Occurred()) return nullptr;
    plan->doubles.push_back(d);
  }
  if (!kiln_strings(strings, plan->strings)) return nullptr;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dtypes); ++i) {
    PyObject* d = PyList_GET_ITEM(dtypes, i);
    if (!THPDtype_Check(d)) { PyErr_SetString(PyExc_TypeError, "make_plan: a dtype"); return nullptr; }
    plan->dtypes.push_back(reinterpret_cast<THPDtype*>(d)->scalar_type);
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); ++i) {
    const char *name, *overload;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(ops, i), "ss", &name, &overload)) return nullptr;
    try {
      plan->ops.push_back(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
      return nullptr;
    }
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sites); ++i) {
    long long site, kind;
    PyObject* pieces;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(sites, i), "LLO!", &site, &kind, &PyList_Type, &pieces)) return nullptr;
    kiln_plan::Site s{kind, {}};
    if (!kiln_strings(pieces, s.pieces)) return nullptr;
    plan->sites[site] = std::move(s);
  }
  PyObject* made = Py_BuildValue("(KOOO)", 0ULL, kernels, constants, follow);
  if (made == nullptr) return nullptr;
  PyObject* capsule = kiln_make(nullptr, made);
  Py_DECREF(made);
  if (capsule == nullptr) return nullptr;
  auto* h = static_cast<KilnHandle*>(PyCapsule_GetPointer(capsule, "kiln.native"));
  h->plan = plan.release();
  return capsule;
}

static bool kiln_unpack(PyObject* o, std::vector<c10::IValue>& in) {
  if (THPVariable_Check(o)) { in.emplace_back(THPVariable_Unpack(o)); return true; }
  if (PyBool_Check(o)) { in.emplace_back(o == Py_True); return true; }
  if (PyLong_Check(o)) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return false;
    in.emplace_back(static_cast<int64_t>(v)); return true;
  }
  if (PyFloat_Check(o)) { in.emplace_back(PyFloat_AS_DOUBLE(o)); return true; }
  if (o == Py_None) { in.emplace_back(); return true; }
  PyErr_Format(PyExc_TypeError, "kiln native wrapper: an argument of type %s", Py_TYPE(o)->tp_name);
  return false;
}

static PyObject* kiln_wrap(c10::IValue& v) {
  if (v.isTensor()) return THPVariable_Wrap(std::move(v).toTensor());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isNone()) Py_RETURN_NONE;
  PyErr_SetString(PyExc_RuntimeError, "kiln native wrapper: an output of an unexpected kind");
  return nullptr;
}

struct KilnNoGil {
  PyThreadState* state;
  KilnNoGil() : state(PyEval_SaveThread()) {}
  ~KilnNoGil() { PyEval_RestoreThread(state); }
};

// What one run of a graph left behind besides its outputs: a failed check (kind, message), or an
// exception (a Python kernel's, an ATen call's, any other) to raise once the GIL is back.
struct KilnRunErrors {
  int64_t kind = 0;
  std::string message;
  PyObject* raised = nullptr;
  std::exception_ptr python_error;  // a Python kernel's exception (a torch.library op), raised as itself
  std::exception_ptr aten_error;
};

// The graph run on `in` (emptied after), without the GIL: the caller holds none.
static void kiln_run_released(KilnHandle* h, std::vector<c10::IValue>& in, std::vector<c10::IValue>& outs,
                              KilnRunErrors& errors) {
  try {
    if (h->plan != nullptr)
      kiln_plan_run(*h->plan, in.data(), static_cast<int64_t>(in.size()), &outs, h->kernels.data(),
                    h->kernels.size(), h->constants, &errors.kind, &errors.message);
    else
      h->fn(in.data(), static_cast<int64_t>(in.size()), &outs, h->kernels.data(), h->constants.data(), &errors.kind,
            &errors.message);
  } catch (const pybind11::error_already_set&) {
    errors.python_error = std::current_exception();
  } catch (const c10::Error&) {
    // an ATen call's error becomes the Python exception eager's binding raises for it (torch's own
    // translation: LinAlgError, OutOfMemoryError, IndexError... each its type), once the GIL is back
    errors.aten_error = std::current_exception();
  } catch (const std::exception& e) {
    errors.raised = PyExc_RuntimeError; errors.message = e.what();
  }
  in.clear();  // the arguments the graph did not free yet, still without the GIL
}

// With the GIL: the Python exception a run's errors stand for set, and true; false for a clean run.
static bool kiln_set_run_error(KilnRunErrors& errors) {
  if (errors.python_error) {
    try {
      std::rethrow_exception(errors.python_error);
    } catch (pybind11::error_already_set& e) {
      e.restore();
    }
    errors.python_error = nullptr;
    return true;
  }
  if (errors.aten_error) {
    torch::translate_exception_to_python(errors.aten_error);
    return true;
  }
  if (errors.raised != nullptr) {
    PyErr_SetString(errors.raised, errors.message.c_str());
    return true;
  }
  int64_t kind = errors.kind;
  if (kind == 6 || kind == 7) {  // kiln.errors.ExternMismatchError; 6: nothing outside the graph written yet
    PyObject* module = PyImport_ImportModule("kiln.errors");
    PyObject* type = module == nullptr ? nullptr : PyObject_GetAttrString(module, "ExternMismatchError");
    Py_XDECREF(module);
    if (type == nullptr) return true;
    PyObject* exc = PyObject_CallFunction(type, "sO", errors.message.c_str(), kind == 6 ? Py_True : Py_False);
    Py_DECREF(type);
    if (exc == nullptr) return true;
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
    Py_DECREF(exc);
    return true;
  }
  if (kind != 0) {
    PyObject* type = kind == 1 ? PyExc_IndexError : kind == 3 ? PyExc_ValueError
        : kind == 4 ? PyExc_ZeroDivisionError : kind == 5 ? PyExc_TypeError : PyExc_RuntimeError;
    PyErr_SetString(type, errors.message.c_str());
    return true;
  }
  return false;
}

// Whether the kernel library already has torch's thread count (else `follow` must run, in Python).
static bool kiln_threads_current(KilnHandle* h) {
  return h->follow == nullptr || at::get_num_threads() == h->threads;
}

// The graph run on `in` into `outs`, the GIL held on entry and on return and released around the
// run where `release` (false: a plan of Kiln's kernels only on small inputs, whose run is shorter
// than taking the GIL back); false with the Python exception set.
static bool kiln_run_outs(KilnHandle* h, std::vector<c10::IValue>& in, std::vector<c10::IValue>& outs, bool release) {
  if (!kiln_threads_current(h)) {
    int threads = at::get_num_threads();  // torch.set_num_threads between calls reaches the kernels
    PyObject* r = PyObject_CallNoArgs(h->follow);
    if (r == nullptr) return false;
    Py_DECREF(r);
    h->threads = threads;
  }
  KilnRunErrors errors;
  if (release) {
    // Other Python threads run while the graph does, as they do during each ctypes kernel call of
    // the Python wrapper; ATen takes the GIL itself where it needs it (a tensor's Python object).
    KilnNoGil released;
    kiln_run_released(h, in, outs, errors);
  } else {
    kiln_run_released(h, in, outs, errors);
  }
  return !kiln_set_run_error(errors);
}

// The outputs as a tuple of Python objects (emptied).
static PyObject* kiln_wrap_all(std::vector<c10::IValue>& outs) {
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (result == nullptr) return nullptr;
  for (size_t i = 0; i < outs.size(); ++i) {
    PyObject* o = kiln_wrap(outs[i]);
    if (o == nullptr) { Py_DECREF(result); return nullptr; }
    PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(i), o);
  }
  return result;
}

static PyObject* kiln_run(KilnHandle* h, std::vector<c10::IValue>& in) {
  std::vector<c10::IValue> outs;
  if (!kiln_run_outs(h, in, outs, true)) return nullptr;
  return kiln_wrap_all(outs);
}

static KilnHandle* kiln_handle(PyObject* capsule) {
  return static_cast<KilnHandle*>(PyCapsule_GetPointer(capsule, "kiln.native"));
}

// call(handle, *args) -> tuple
static PyObject* kiln_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1) { PyErr_SetString(PyExc_TypeError, "call(handle, *args)"); return nullptr; }
  KilnHandle* h = kiln_handle(args[0]);
  if (h == nullptr) return nullptr;
  std::vector<c10::IValue> in;
  in.reserve(static_cast<size_t>(nargs - 1));
  for (Py_ssize_t i = 1; i < nargs; ++i)
    if (!kiln_unpack(args[i], in)) return nullptr;
  return kiln_run(h, in);
}

// steal(handle, list) -> tuple: the list is emptied first, so the graph holds the only
// references and frees each argument after its last use (what the compiled backward wants)
static PyObject* kiln_steal(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[1])) { PyErr_SetString(PyExc_TypeError, "steal(handle, list)"); return nullptr; }
  KilnHandle* h = kiln_handle(args[0]);
  if (h == nullptr) return nullptr;
  PyObject* list = args[1];
  std::vector<c10::IValue> in;
  in.reserve(static_cast<size_t>(PyList_GET_SIZE(list)));
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i)
    if (!kiln_unpack(PyList_GET_ITEM(list, i), in)) return nullptr;
  if (PyList_SetSlice(list, 0, PyList_GET_SIZE(list), nullptr) != 0) return nullptr;
  return kiln_run(h, in);
}


// A plain inference graph's direct entry (kiln.runtime.aot.AotRuntime once its native wrapper runs):
// `direct(handle, not_views, number of outputs, no_grad)` is a callable object that does what
// AotRuntime's plain call does around the native wrapper, in one C call: run the graph (with grad
// mode off where `no_grad`: kiln.runtime.aot.without_grad), replace the results at `not_views` that
// are autograd views by detached aliases (kiln.runtime.aot.not_views) and return the tuple. A plan of
// Kiln's kernels only (no ATen or Python call inside) keeps the GIL on inputs of at most
// HOLD_GIL_ELEMENTS elements: dropping and taking it back costs more than such a run.
static constexpr int64_t HOLD_GIL_ELEMENTS = 1 << 14;

struct KilnDirect {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* capsule;  // the handle's (a strong reference)
  KilnHandle* h;
  std::vector<Py_ssize_t>* not_views;
  Py_ssize_t num_outputs;
  bool no_grad;
  bool kernels_only;
};

static PyObject* kiln_direct_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* d = reinterpret_cast<KilnDirect*>(self);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "a compiled graph takes no keyword arguments");
    return nullptr;
  }
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  std::vector<c10::IValue> in;
  in.reserve(static_cast<size_t>(nargs));
  bool release = !d->kernels_only;
  int64_t elements = 0;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (!kiln_unpack(args[i], in)) return nullptr;
    if (!release && in.back().isTensor()) {
      const at::Tensor& t = in.back().toTensor();
      // a tensor whose sizes are not plain integers (a subclass's) counts as large
      elements += t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ? HOLD_GIL_ELEMENTS + 1 : t.numel();
      release = elements > HOLD_GIL_ELEMENTS;
    }
  }
  std::vector<c10::IValue> outs;
  {
    std::optional<at::AutoGradMode> grad_off;
    if (d->no_grad && at::GradMode::is_enabled()) grad_off.emplace(false);
    if (!kiln_run_outs(d->h, in, outs, release)) return nullptr;
  }
  if (static_cast<Py_ssize_t>(outs.size()) != d->num_outputs) {
    PyErr_Format(PyExc_RuntimeError, "kiln internal error: a compiled graph returned %zd results, its runtime "
                 "expected %zd", static_cast<Py_ssize_t>(outs.size()), d->num_outputs);
    return nullptr;
  }
  try {
    for (Py_ssize_t k : *d->not_views) {
      c10::IValue& o = outs[static_cast<size_t>(k)];
      // an undefined tensor (an extern's result its kernel left out, returned as None) has no view state
      if (o.isTensor() && o.toTensor().defined() && o.toTensor().is_view()) o = o.toTensor().detach();
    }
  } catch (const c10::Error&) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
  return kiln_wrap_all(outs);
}

static void kiln_direct_free(PyObject* self) {
  auto* d = reinterpret_cast<KilnDirect*>(self);
  Py_XDECREF(d->capsule);
  delete d->not_views;
  Py_TYPE(self)->tp_free(self);
}

static PyTypeObject kiln_direct_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// direct(handle, not_views tuple, number of outputs, no_grad) -> callable
static PyObject* kiln_direct(PyObject*, PyObject* args) {
  PyObject *capsule, *positions;
  Py_ssize_t num_outputs;
  int no_grad;
  if (!PyArg_ParseTuple(args, "OO!np", &capsule, &PyTuple_Type, &positions, &num_outputs, &no_grad)) return nullptr;
  KilnHandle* h = kiln_handle(capsule);
  if (h == nullptr) return nullptr;
  auto not_views = std::make_unique<std::vector<Py_ssize_t>>();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(positions); ++i) {
    Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, i));
    if (k == -1 && PyErr_Occurred()) return nullptr;
    if (k < 0 || k >= num_outputs) { PyErr_SetString(PyExc_ValueError, "direct: a position outside the outputs"); return nullptr; }
    not_views->push_back(k);
  }
  auto* d = PyObject_New(KilnDirect, &kiln_direct_type);
  if (d == nullptr) return nullptr;
  d->vectorcall = kiln_direct_call;
  Py_INCREF(capsule);
  d->capsule = capsule;
  d->h = h;
  d->not_views = not_views.release();
  d->num_outputs = num_outputs;
  d->no_grad = no_grad != 0;
  d->kernels_only = h->plan != nullptr && h->plan->ops.empty();
  return reinterpret_cast<PyObject*>(d);
}

static bool kiln_direct_ready() {
  if (kiln_direct_type.tp_flags & Py_TPFLAGS_READY) return true;
  kiln_direct_type.tp_name = "kiln_native.Direct";
  kiln_direct_type.tp_basicsize = sizeof(KilnDirect);
  kiln_direct_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  kiln_direct_type.tp_vectorcall_offset = offsetof(KilnDirect, vectorcall);
  kiln_direct_type.tp_call = PyVectorcall_Call;
  kiln_direct_type.tp_dealloc = kiln_direct_free;
  kiln_direct_type.tp_doc = "a plain inference graph's native call (direct(handle, not_views, n_out, no_grad))";
  return PyType_Ready(&kiln_direct_type) == 0;
}


// Guard helpers (kiln.capture.guards): a tensor's metadata and a dict's keys checked in one call
// each, where the generated Python check reads a dozen attributes.
struct KilnTensorSpec {
  PyTypeObject* type;  // exact type (a strong reference)
  at::ScalarType dtype;
  c10::DeviceType device_type;
  int device_index;  // -1: any index (the CPU's)
  at::Layout layout;
  bool requires_grad, inference, complex_bits, conj, neg;
  std::vector<int64_t> sizes, strides;
  std::vector<char> size_known, stride_known;
  bool check_strides;
  std::vector<std::pair<int64_t, int64_t>> links;  // stride[i] == size[j] * stride[j]
  // the dims that may carry kiln.mark_dynamic's marks (a frozenset, a strong reference), or NULL:
  // getattr(t, "_kiln_dynamic_dims", marks) <= marks (kiln.capture.guards.native._marks_check)
  PyObject* marks = nullptr;
};

static void kiln_spec_free(PyObject* capsule) {
  auto* s = static_cast<KilnTensorSpec*>(PyCapsule_GetPointer(capsule, "kiln.tensor_spec"));
  if (s == nullptr) { PyErr_Clear(); return; }
  Py_XDECREF(reinterpret_cast<PyObject*>(s->type));
  Py_XDECREF(s->marks);
  delete s;
}

static bool kiln_int_or_none(PyObject* tuple, std::vector<int64_t>& values, std::vector<char>& known) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); ++i) {
    PyObject* o = PyTuple_GET_ITEM(tuple, i);
    if (o == Py_None) { values.push_back(0); known.push_back(0); continue; }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return false;
    values.push_back(v); known.push_back(1);
  }
  return true;
}

// tensor_spec(type, dtype, device type, device index, layout, requires_grad, sizes, strides or None,
//             links, inference, complex, conj, neg[, marks frozenset or None]) -> spec
static PyObject* kiln_tensor_spec(PyObject*, PyObject* args) {
  PyObject *type, *dtype, *layout, *sizes, *strides, *links, *marks = Py_None;
  const char* device_type;
  int device_index, requires_grad, inference, complex_bits, conj, neg;
  if (!PyArg_ParseTuple(args, "O!OsiOpO!OO!pppp|O", &PyType_Type, &type, &dtype, &device_type, &device_index, &layout,
                        &requires_grad, &PyTuple_Type, &sizes, &strides, &PyTuple_Type, &links, &inference,
                        &complex_bits, &conj, &neg, &marks))
    return nullptr;
  if (marks != Py_None && !PyFrozenSet_CheckExact(marks)) {
    PyErr_SetString(PyExc_TypeError, "tensor_spec: the marks are a frozenset or None");
    return nullptr;
  }
  if (!THPDtype_Check(dtype) || !THPLayout_Check(layout) || (strides != Py_None && !PyTuple_Check(strides))) {
    PyErr_SetString(PyExc_TypeError, "tensor_spec: a dtype, a layout and a tuple of strides or None");
    return nullptr;
  }
  auto* s = new KilnTensorSpec();
  try {
    s->device_type = c10::Device(std::string(device_type)).type();
  } catch (const c10::Error& e) {
    delete s;
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    return nullptr;
  }
  s->dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  s->layout = reinterpret_cast<THPLayout*>(layout)->layout;
  s->device_index = device_index;
  s->requires_grad = requires_grad; s->inference = inference; s->complex_bits = complex_bits;
  s->conj = conj; s->neg = neg;
  s->check_strides = strides != Py_None;
  bool ok = kiln_int_or_none(sizes, s->sizes, s->size_known)
      && (strides == Py_None || kiln_int_or_none(strides, s->strides, s->stride_known));
  if (ok && strides != Py_None && s->strides.size() != s->sizes.size()) {
    PyErr_SetString(PyExc_ValueError, "tensor_spec: a stride per size");
    ok = false;
  }
  for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(links); ++i) {
    long long a, b;
    ok = PyArg_ParseTuple(PyTuple_GET_ITEM(links, i), "LL", &a, &b);
    if (ok && (a < 0 || b < 0 || a >= static_cast<long long>(s->sizes.size()) || b >= static_cast<long long>(s->sizes.size()))) {
      PyErr_SetString(PyExc_ValueError, "tensor_spec: a stride link outside the dims");
      ok = false;
    }
    if (ok) s->links.emplace_back(a, b);
  }
  if (!ok) { delete s; return nullptr; }
  Py_INCREF(type);
  s->type = reinterpret_cast<PyTypeObject*>(type);
  if (marks != Py_None) { Py_INCREF(marks); s->marks = marks; }
  PyObject* capsule = PyCapsule_New(s, "kiln.tensor_spec", kiln_spec_free);
  if (capsule == nullptr) { Py_DECREF(type); Py_XDECREF(s->marks); delete s; }
  return capsule;
}

static bool kiln_tensor_matches(const at::Tensor& t, const KilnTensorSpec* s) {
  if (t.scalar_type() != s->dtype || t.layout() != s->layout || t.requires_grad() != s->requires_grad) return false;
  c10::Device device = t.device();
  if (device.type() != s->device_type || (s->device_index >= 0 && device.index() != s->device_index)) return false;
  auto sizes = t.sizes();
  size_t dim = s->sizes.size();
  if (sizes.size() != dim) return false;
  for (size_t d = 0; d < dim; ++d)
    if (s->size_known[d] && sizes[d] != s->sizes[d]) return false;
  if (s->check_strides) {
    auto strides = t.strides();
    for (size_t d = 0; d < dim; ++d)
      if (s->stride_known[d] && strides[d] != s->strides[d]) return false;
    for (const auto& [i, j] : s->links)
      if (strides[i] != sizes[j] * strides[j]) return false;
  }
  if (t.is_inference() != s->inference) return false;
  if (s->complex_bits && (t.is_conj() != s->conj || t.is_neg() != s->neg)) return false;
  return true;
}

// Whether `value` passes `s`: 1, 0, or -1 with a Python exception set.
static int kiln_tensor_passes(PyObject* value, const KilnTensorSpec* s) {
  // exact type first: the spec's type is a tensor type (guards.py makes specs for those only)
  if (Py_TYPE(value) != s->type || !THPVariable_Check(value)) return 0;
  bool ok;
  try {
    ok = kiln_tensor_matches(THPVariable_Unpack(value), s);
  } catch (const c10::Error&) {
    ok = false;  // metadata that cannot be read (a nested tensor's sizes): not the tensor captured
  }
  if (ok && s->marks != nullptr) {
    // the marks live on the tensor object (kiln.symbolic.marks): getattr without raising AttributeError
    static PyObject* name = PyUnicode_InternFromString("_kiln_dynamic_dims");
    if (name == nullptr) return -1;
    PyObject* marks = nullptr;
    if (_PyObject_LookupAttr(value, name, &marks) < 0) return -1;
    if (marks != nullptr) {
      int within = PyObject_RichCompareBool(marks, s->marks, Py_LE);
      Py_DECREF(marks);
      if (within < 0) return -1;
      ok = within == 1;
    }
  }
  return ok ? 1 : 0;
}

// tensor_ok(value, spec) -> bool
static PyObject* kiln_tensor_ok(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "tensor_ok(value, spec)"); return nullptr; }
  auto* s = static_cast<KilnTensorSpec*>(PyCapsule_GetPointer(args[1], "kiln.tensor_spec"));
  if (s == nullptr) return nullptr;
  int ok = kiln_tensor_passes(args[0], s);
  if (ok < 0) return nullptr;
  if (ok) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// Whether any autocast is on: an autocast dispatch key no longer excluded for this thread (a superset
// of the devices torch._C._is_any_autocast_enabled asks about, so "none" here is "none" there).
static bool kiln_any_autocast() {
  return !c10::impl::tls_local_dispatch_key_set().excluded_.has_all(c10::autocast_dispatch_keyset);
}

// The torch function mode stack is the one a graph was traced under (kiln.capture.device_context):
// `expected` None, no mode; a torch.device, only DeviceContexts (set_default_device, `with
// torch.device`), the innermost of that device, modes on. Any other mode must see eager's calls,
// and so must a user's dispatch mode.
// 1, 0, or -1 with an exception set.
static PyObject* kiln_device_context_type = nullptr;  // torch.utils._device.DeviceContext, once read
static PyObject* kiln_device_name = nullptr;          // "device", interned
static int kiln_modes_ok(PyObject* expected) {
  // A user's TorchDispatchMode (on the stack, not in an infra slot) sees every aten op: no graph
  // runs under one (kiln.capture.device_context.user_dispatch_mode).
  if (c10::impl::TorchDispatchModeTLS::any_modes_set(/*skip_infra_modes=*/true)) return 0;
  int64_t n = at::impl::PythonTorchFunctionTLS::stack_len();
  if (n == 0) return expected == Py_None;
  if (expected == Py_None || !at::impl::torch_function_mode_enabled()) return 0;
  if (kiln_device_context_type == nullptr) {
    PyObject* module = PyImport_ImportModule("torch.utils._device");
    if (module == nullptr) return -1;
    kiln_device_context_type = PyObject_GetAttrString(module, "DeviceContext");
    Py_DECREF(module);
    if (kiln_device_context_type == nullptr) return -1;
    kiln_device_name = PyUnicode_InternFromString("device");
    if (kiln_device_name == nullptr) return -1;
  }
  PyObject* mode = nullptr;  // every mode exactly a DeviceContext; the innermost one's device counts
  for (int64_t i = 0; i < n; ++i) {
    mode = at::impl::PythonTorchFunctionTLS::get_stack_at(i)->ptr(getPyInterpreter());
    if (reinterpret_cast<PyObject*>(Py_TYPE(mode)) != kiln_device_context_type) return 0;
  }
  PyObject* device = PyObject_GetAttr(mode, kiln_device_name);
  if (device == nullptr) { PyErr_Clear(); return 0; }
  int same = THPDevice_Check(device)
      && reinterpret_cast<THPDevice*>(device)->device == reinterpret_cast<THPDevice*>(expected)->device;
  Py_DECREF(device);
  return same;
}

// state_ok(grad mode or None, default dtype, default device or None) -> bool: grad mode, the default
// dtype, no autocast and the torch function mode stack (kiln_modes_ok), the process-wide state a
// graph bakes in (kiln.capture.guards.global_kinds), in one call
static PyObject* kiln_state_ok(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !THPDtype_Check(args[1]) || !(args[2] == Py_None || THPDevice_Check(args[2]))) {
    PyErr_SetString(PyExc_TypeError, "state_ok(grad or None, dtype, device or None)");
    return nullptr;
  }
  bool ok = (args[0] == Py_None || at::GradMode::is_enabled() == (args[0] == Py_True))
      && c10::get_default_dtype_as_scalartype() == reinterpret_cast<THPDtype*>(args[1])->scalar_type
      && !kiln_any_autocast();
  if (!ok) Py_RETURN_FALSE;
  int modes = kiln_modes_ok(args[2]);
  if (modes < 0) return nullptr;
  if (modes) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// same_keys(mapping, keys tuple) -> bool: list(mapping.keys()) == list(keys)
static PyObject* kiln_same_keys(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[1])) { PyErr_SetString(PyExc_TypeError, "same_keys(mapping, tuple)"); return nullptr; }
  PyObject* d = args[0];
  PyObject* keys = args[1];
  Py_ssize_t n = PyTuple_GET_SIZE(keys);
  if (!PyDict_CheckExact(d)) {  // an OrderedDict (its own order) or another mapping: as Python does it
    PyObject* view = PyObject_CallMethod(d, "keys", nullptr);
    if (view == nullptr) return nullptr;
    PyObject* now = PySequence_List(view);
    Py_DECREF(view);
    if (now == nullptr) return nullptr;
    PyObject* expected = PySequence_List(keys);
    if (expected == nullptr) { Py_DECREF(now); return nullptr; }
    PyObject* result = PyObject_RichCompare(now, expected, Py_EQ);
    Py_DECREF(now);
    Py_DECREF(expected);
    return result;
  }
  if (PyDict_GET_SIZE(d) != n) Py_RETURN_FALSE;
  Py_INCREF(d);
  Py_ssize_t pos = 0, i = 0;
  PyObject *key, *value;
  int same = 1;
  while (same == 1 && PyDict_Next(d, &pos, &key, &value)) {
    if (i >= n) { same = 0; break; }
    PyObject* expected = PyTuple_GET_ITEM(keys, i++);
    if (key != expected) {
      Py_INCREF(key);  // a key's __eq__ may change the dict
      same = PyObject_RichCompareBool(key, expected, Py_EQ);
      Py_DECREF(key);
    }
  }
  if (same == 1 && (i != n || PyDict_GET_SIZE(d) != n)) same = 0;
  Py_DECREF(d);
  if (same < 0) return nullptr;
  if (same) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// empty_attrs(obj, names tuple) -> bool: len(obj.<name>) == 0 for each name (a module's hook dicts)
static PyObject* kiln_empty_attrs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[1])) { PyErr_SetString(PyExc_TypeError, "empty_attrs(obj, tuple)"); return nullptr; }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[1]); ++i) {
    PyObject* value = PyObject_GetAttr(args[0], PyTuple_GET_ITEM(args[1], i));
    if (value == nullptr) return nullptr;
    Py_ssize_t n = PyObject_Size(value);
    Py_DECREF(value);
    if (n < 0) return nullptr;
    if (n != 0) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

// ---------------------------------------------------------------------------------------------------
// The autograd node of a compiled training graph (kiln.runtime.aot.make_autograd_function's node path)

// the pending Python exception as the C++ exception the autograd engine hands back to Python
[[noreturn]] static void kiln_raise_python() {
  python_error error;
  error.persist();
  throw std::move(error);
}

// One call's node: the graph's saved tensors (SavedVariable: version counters, saved-tensor hooks and
// the output/no-cycle rule as for any node), its size outputs, and the Python callable that runs the
// compiled backward on [saved..., sizes..., gradients...] and returns one gradient per forward input
// (`create_graph` in its place under backward(create_graph=True): gradients with a history).
struct KilnCompiledBackward : public torch::autograd::Node {
  PyObject* backward = nullptr;
  PyObject* create_graph = nullptr;
  PyObject* symints = nullptr;  // a tuple
  PyObject* native = nullptr;  // the backward's native handle (a capsule), when `backward` is its steal
  KilnHandle* handle = nullptr;  // what `native` holds
  std::vector<torch::autograd::SavedVariable> saved;
  std::vector<char> needs;  // per forward input: whether its gradient is wanted

  ~KilnCompiledBackward() override {
    // a node freed while the interpreter shuts down leaks its references (the GIL is gone)
    if ((backward != nullptr || create_graph != nullptr || symints != nullptr || native != nullptr)
        && Py_IsInitialized() && !_Py_IsFinalizing()) {
      pybind11::gil_scoped_acquire gil;
      Py_XDECREF(backward);
      Py_XDECREF(create_graph);
      Py_XDECREF(symints);
      Py_XDECREF(native);
    }
  }
  std::string name() const override { return "CompiledFunctionBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    KilnHandle* h = handle;
    if (h != nullptr && PyTuple_GET_SIZE(symints) == 0 && !at::GradMode::is_enabled() && kiln_threads_current(h))
      return apply_released(h, std::move(grads));
    pybind11::gil_scoped_acquire gil;
    size_t n_saved = saved.size();
    Py_ssize_t n_sym = symints != nullptr ? PyTuple_GET_SIZE(symints) : 0;
    THPObjectPtr list(PyList_New(static_cast<Py_ssize_t>(n_saved + grads.size()) + n_sym));
    if (!list) kiln_raise_python();
    auto self = getptr();
    for (size_t i = 0; i < n_saved; ++i) {
      PyObject* t = THPVariable_Wrap(saved[i].unpack(self));
      if (t == nullptr) kiln_raise_python();
      PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), t);
    }
    for (Py_ssize_t i = 0; i < n_sym; ++i) {
      PyObject* v = PyTuple_GET_ITEM(symints, i);
      Py_INCREF(v);
      PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(n_saved) + i, v);
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      // the backward graph was traced with contiguous tangents; an unused output's gradient is zeros
      at::Tensor g = grads[i].defined() ? grads[i].contiguous() : input_metadata(i).zeros_like();
      PyObject* t = THPVariable_Wrap(std::move(g));
      if (t == nullptr) kiln_raise_python();
      PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(n_saved + i) + n_sym, t);
    }
    grads.clear();
    // without retain_graph the list holds the only references: the backward frees each activation
    // after its last use (the saved variables would keep them until after this call); a released
    // SavedVariable raises eager's "backward through the graph a second time" when unpacked again
    if (!torch::autograd::get_current_graph_task_keep_graph()) release_variables();
    // the engine runs a node with grad mode on only under create_graph=True
    THPObjectPtr result(PyObject_CallOneArg(at::GradMode::is_enabled() ? create_graph : backward, list.get()));
    list = nullptr;
    if (!result) kiln_raise_python();
    THPObjectPtr seq(PySequence_Fast(result.get(), "the compiled backward returned no sequence"));
    if (!seq) kiln_raise_python();
    size_t n = num_outputs();
    if (static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.get())) != n) {
      throw std::runtime_error("kiln internal error: the compiled backward returned another number of gradients "
                               "than its forward had inputs");
    }
    torch::autograd::variable_list out(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* g = PySequence_Fast_GET_ITEM(seq.get(), static_cast<Py_ssize_t>(i));
      if (needs[i] && THPVariable_Check(g)) out[i] = THPVariable_Unpack(g);
    }
    return out;
  }

  void release_variables() override {
    for (auto& s : saved) s.reset_data();
  }

  // The common backward (no create_graph, no size outputs, the kernels' thread count current): the
  // native backward run from here, on IValues, never taking the GIL (the Python path takes it to
  // build a list and call the wrapper, which releases it again to run the graph), as eager's own
  // nodes run. The GIL is taken only to raise a failed check's or a Python kernel's exception.
  torch::autograd::variable_list apply_released(KilnHandle* h, torch::autograd::variable_list&& grads) {
    std::vector<c10::IValue> in;
    in.reserve(saved.size() + grads.size());
    auto self = getptr();
    for (auto& s : saved) in.emplace_back(s.unpack(self));
    for (size_t i = 0; i < grads.size(); ++i)
      in.emplace_back(grads[i].defined() ? grads[i].contiguous() : input_metadata(i).zeros_like());
    grads.clear();
    if (!torch::autograd::get_current_graph_task_keep_graph()) release_variables();
    std::vector<c10::IValue> outs;
    KilnRunErrors errors;
    kiln_run_released(h, in, outs, errors);
    if (errors.python_error || errors.aten_error || errors.raised != nullptr || errors.kind != 0) {
      pybind11::gil_scoped_acquire gil;
      kiln_set_run_error(errors);
      kiln_raise_python();
    }
    size_t n = num_outputs();
    if (outs.size() != n) {
      throw std::runtime_error("kiln internal error: the compiled backward returned another number of gradients "
                               "than its forward had inputs");
    }
    torch::autograd::variable_list out(n);
    for (size_t i = 0; i < n; ++i)
      if (needs[i] && outs[i].isTensor()) out[i] = outs[i].toTensor();
    return out;
  }
};

// apply_node(forward, backward, create_graph backward, args tuple, number of user outputs, number of
//            saved tensors, non-differentiable flags (a tuple per user output, or None), needs (a tuple
//            per input), detached (bool))
//   -> the user outputs: forward(*args) runs with grad mode off on the caller's tensors, or, with
//   `detached` (a forward whose ATen calls may read grad mode: the oneDNN RNN keeps its workspace
//   only with it on), with grad mode on and each input that requires grad replaced by a detached
//   alias (same storage and version counter), as the Python Function's forward runs it; either way
//   nothing inside records a history. Where grad mode is on and an input requires grad, the
//   differentiable outputs get one KilnCompiledBackward node whose edges are the inputs'. Outputs the
//   forward hands out as views are replaced by detached aliases (kiln.runtime.aot.not_views), as the
//   Python Function's forward does.
static PyObject* kiln_apply_node(PyObject*, PyObject* const* a, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if ((nargs != 9 && nargs != 10) || !PyTuple_Check(a[3]) || !PyTuple_Check(a[7])) {
    PyErr_SetString(PyExc_TypeError, "apply_node(forward, backward, create_graph, args, n_out, n_saved, non_diff, "
                                     "needs, detached[, native backward handle or None])");
    return nullptr;
  }
  PyObject* native = nargs == 10 && a[9] != Py_None ? a[9] : nullptr;
  if (native != nullptr && !PyCapsule_IsValid(native, "kiln.native")) {
    PyErr_SetString(PyExc_TypeError, "apply_node: the backward handle is not a native wrapper's");
    return nullptr;
  }
  PyObject* args = a[3];
  Py_ssize_t n_out = PyLong_AsSsize_t(a[4]);
  Py_ssize_t n_saved = PyLong_AsSsize_t(a[5]);
  if ((n_out == -1 || n_saved == -1) && PyErr_Occurred()) return nullptr;
  PyObject* non_diff = a[6] == Py_None ? nullptr : a[6];
  PyObject* needs = a[7];
  Py_ssize_t n_in = PyTuple_GET_SIZE(args);
  if (PyTuple_GET_SIZE(needs) != n_in || (non_diff != nullptr && PyTuple_GET_SIZE(non_diff) != n_out)) {
    PyErr_SetString(PyExc_ValueError, "apply_node: flags of another length");
    return nullptr;
  }
  bool detached = a[8] == Py_True;
  torch::autograd::variable_list inputs(static_cast<size_t>(n_in));
  bool requires = false;  // the call records a node
  bool any_requires = false;  // an input requires grad (whatever the grad mode)
  bool grad_on = at::GradMode::is_enabled();
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    PyObject* v = PyTuple_GET_ITEM(args, i);
    if (THPVariable_Check(v)) {
      inputs[i] = THPVariable_Unpack(v);
      any_requires = any_requires || inputs[i].requires_grad();
    }
  }
  requires = grad_on && any_requires;
  THPObjectPtr outs;
  if (detached) {
    THPObjectPtr cut;  // the arguments with detached aliases of those that require grad
    if (any_requires) {
      cut = PyTuple_New(n_in);
      if (!cut) return nullptr;
      for (Py_ssize_t i = 0; i < n_in; ++i) {
        PyObject* v = PyTuple_GET_ITEM(args, i);
        PyObject* w;
        if (inputs[i].defined() && inputs[i].requires_grad()) {
          w = THPVariable_Wrap(inputs[i].detach());
          if (w == nullptr) return nullptr;
        } else {
          Py_INCREF(v);
          w = v;
        }
        PyTuple_SET_ITEM(cut.get(), i, w);
      }
    }
    at::AutoGradMode on(true);  // the grad mode the joint graph was traced with
    outs = PyObject_Call(a[0], cut ? cut.get() : args, nullptr);
  } else {
    at::AutoGradMode off(false);
    outs = PyObject_Call(a[0], args, nullptr);
  }
  if (!outs) return nullptr;
  if (!PyTuple_Check(outs.get()) || PyTuple_GET_SIZE(outs.get()) < n_out + n_saved) {
    PyErr_SetString(PyExc_RuntimeError, "kiln internal error: a compiled forward returned fewer results than it has");
    return nullptr;
  }
  c10::intrusive_ptr<KilnCompiledBackward> node;
  if (requires) {
    node = c10::make_intrusive<KilnCompiledBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(inputs));
    node->needs.resize(static_cast<size_t>(n_in));
    for (Py_ssize_t i = 0; i < n_in; ++i) node->needs[i] = PyObject_IsTrue(PyTuple_GET_ITEM(needs, i)) == 1;
  }
  THPObjectPtr result(PyTuple_New(n_out));
  if (!result) return nullptr;
  std::vector<c10::TensorImpl*> user;
  for (Py_ssize_t k = 0; k < n_out; ++k) {
    PyObject* o = PyTuple_GET_ITEM(outs.get(), k);
    if (!THPVariable_Check(o)) {
      Py_INCREF(o);
      PyTuple_SET_ITEM(result.get(), k, o);
      continue;
    }
    at::Tensor t = THPVariable_Unpack(o);
    bool seen = std::find(user.begin(), user.end(), t.unsafeGetTensorImpl()) != user.end();
    if (t.is_view() || seen) t = t.detach();  // no autograd view, and one history per result
    if (node) {
      bool differentiable = non_diff == nullptr || PyObject_IsTrue(PyTuple_GET_ITEM(non_diff, k)) != 1;
      if (differentiable && torch::autograd::isDifferentiableType(t.scalar_type())) {
        torch::autograd::set_history(t, node);
      } else if (differentiable) {
        node->add_input_metadata(t);  // a slot for its (zero) gradient, no edge: it cannot require grad
      }
    }
    user.push_back(t.unsafeGetTensorImpl());
    PyObject* w = THPVariable_Wrap(std::move(t));
    if (w == nullptr) return nullptr;
    PyTuple_SET_ITEM(result.get(), k, w);
  }
  if (node) {
    for (Py_ssize_t k = n_out; k < n_out + n_saved; ++k) {
      PyObject* o = PyTuple_GET_ITEM(outs.get(), k);
      if (!THPVariable_Check(o)) {
        node->saved.emplace_back();  // None saved (an undefined tensor)
        continue;
      }
      const at::Tensor& t = THPVariable_Unpack(o);
      bool is_output = std::find(user.begin(), user.end(), t.unsafeGetTensorImpl()) != user.end();
      node->saved.emplace_back(t, is_output);
    }
    Py_ssize_t total = PyTuple_GET_SIZE(outs.get());
    node->symints = PyTuple_GetSlice(outs.get(), n_out + n_saved, total);
    if (node->symints == nullptr) return nullptr;
    Py_INCREF(a[1]);
    node->backward = a[1];
    Py_INCREF(a[2]);
    node->create_graph = a[2];
    if (native != nullptr) {
      node->handle = kiln_handle(native);
      if (node->handle == nullptr) return nullptr;
      Py_INCREF(native);
      node->native = native;
    }
  }
  return result.release();
  END_HANDLE_TH_ERRORS
}

// A compiled function's fast entry (kiln.capture.fast_entry): `frame_entry(slow, entries, cached,
// alternatives, bound, nargs, loads, stats, mismatch, on_mismatch, globals)` is a callable object that
// does, in one C call, what the Python entry, the guard checks and the glue of a frame do while its
// cache is `cached` (the frame's list `entries`, item for item) and every guard of every entry is one
// it checks itself. Values are registers: the `bound` objects (a method's self), then the call's
// arguments, then `loads`, each `(source register, kind, key)`: 0 getattr, 1 item (a dict's own
// lookup for an exact dict), 2 a global of `globals`, 3 the constant `key`, 4 the method `key`
// called with no arguments (`.size()`); read once per call, on
// first use, a read that raises failing every check on it. Each alternative (one per cached entry, in
// the list's order, the order the Python loop tries them) is `(runtime name, checks, graph registers,
// out)`, each check `(op, register, argument)` (KOP_*); the first alternative whose checks all
// pass counts the hit (`stats.cache_hits`), calls its runtime (read from its entry's glue namespace)
// on the graph registers and returns its result at `out` (-1: the whole tuple). Anything else
// (another call shape, the list changed, every alternative failing) goes to `slow(*args)`, the Python
// entry's own path, which checks again and compiles or explains. Entries are held weakly
// (kiln.reset() frees their graphs). An ExternMismatchError (`mismatch`) from the graph goes to
// `on_mismatch(exc, args)`, as the glue's.
enum KilnOp {
  KOP_TENSOR = 0,  // tensor metadata (a tensor_spec capsule)
  KOP_IS = 1,      // `v is arg`
  KOP_TYPE = 2,    // `type(v) is arg`
  KOP_LEN = 3,     // `len(v) == arg`
  KOP_VALUE = 4,   // `type(v) is type(arg) and v == arg`, a float zero's sign too
  KOP_KEYS = 5,    // same_keys(v, arg)
  KOP_ABSENT = 6,  // no name of the tuple `arg` in v
  KOP_GRAD = 7,    // grad mode is `arg` (no register)
  KOP_STATE = 8,   // `arg` (dtype, device or None): the default dtype, no autocast, the mode stack (no register)
  KOP_ALIAS = 9,   // `arg`: groups of registers, each one object, the groups' objects distinct
  KOP_IS_NOT = 10,  // `v is not arg`
  KOP_EXPR = 11,    // `arg`: (function, registers): the function's truth on those registers' values
  KOP_IS_REF = 12,  // `arg` a weak reference: `v is arg()`, failing once its object is freed
  KOP_TYPE_REF = 13  // `arg` a weak reference: `type(v) is arg()`, failing once the class is freed
};
// the number of ops this build knows (the module's `frame_entry_ops`): the Python side sends an op
// only to a build that knows it (kiln.capture.fast_entry)
static const int kiln_frame_entry_ops = 14;

struct KilnLoadStep { Py_ssize_t src; int kind; PyObject* key; };
struct KilnCheck {
  int op;
  Py_ssize_t reg;
  PyObject* arg;
  KilnTensorSpec* spec;
  Py_ssize_t n;
  std::vector<std::vector<Py_ssize_t>> groups;
};
struct KilnAlternative {
  PyObject* ref;  // a weak reference to the cache entry
  PyObject* runtime_name;
  std::vector<KilnCheck> checks;
  std::vector<Py_ssize_t> graph_regs;
  Py_ssize_t out;
};

struct KilnEntry {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject *slow, *entries, *refs, *held, *bound, *stats, *mismatch, *on_mismatch, *globals;
  std::vector<KilnLoadStep>* loads;
  std::vector<KilnAlternative>* alts;
  Py_ssize_t nargs, nbound;
};

static char kiln_unreadable;  // a register whose read raised
#define UNREADABLE_REGISTER reinterpret_cast<PyObject*>(&kiln_unreadable)

// register `r` of this call (nullptr: it cannot be read); regs[r] owns what a load read
static PyObject* kiln_register(KilnEntry* e, PyObject** regs, Py_ssize_t r) {
  PyObject* v = regs[r];
  if (v != nullptr) return v == UNREADABLE_REGISTER ? nullptr : v;
  const KilnLoadStep& l = (*e->loads)[static_cast<size_t>(r - e->nbound - e->nargs)];
  PyObject* out = nullptr;
  if (l.kind == 2) {
    out = PyDict_GetItemWithError(e->globals, l.key);
    Py_XINCREF(out);
  } else if (l.kind == 3) {
    out = l.key;
    Py_INCREF(out);
  } else {
    PyObject* base = kiln_register(e, regs, l.src);
    if (base != nullptr) {
      if (l.kind == 0) {
        out = PyObject_GetAttr(base, l.key);
      } else if (l.kind == 4) {
        out = PyObject_CallMethodNoArgs(base, l.key);
      } else if (PyDict_CheckExact(base)) {
        out = PyDict_GetItemWithError(base, l.key);
        Py_XINCREF(out);
      } else {
        out = PyObject_GetItem(base, l.key);
      }
    }
  }
  if (out == nullptr) {
    PyErr_Clear();  // as the Python check: a source that cannot be read fails its guards
    regs[r] = UNREADABLE_REGISTER;
    return nullptr;
  }
  regs[r] = out;
  return out;
}


// 1 when the check passes, 0 when not, -1 with an exception set
static int kiln_check_passes(KilnEntry* e, PyObject** regs, const KilnCheck& c) {
  if (c.op == KOP_GRAD) return at::GradMode::is_enabled() == (c.arg == Py_True);
  if (c.op == KOP_STATE) {
    if (c10::get_default_dtype_as_scalartype() != reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(c.arg, 0))->scalar_type
        || kiln_any_autocast())
      return 0;
    return kiln_modes_ok(PyTuple_GET_ITEM(c.arg, 1));
  }
  if (c.op == KOP_EXPR) {
    c10::SmallVector<PyObject*, 8> values;
    for (Py_ssize_t r : c.groups[0]) {
      PyObject* v = kiln_register(e, regs, r);
      if (v == nullptr) return 0;
      values.push_back(v);
    }
    PyObject* result = PyObject_Vectorcall(c.arg, values.data(), values.size(), nullptr);
    if (result == nullptr) return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
  }
  if (c.op == KOP_ALIAS) {
    c10::SmallVector<PyObject*, 8> firsts;
    for (const auto& group : c.groups) {
      PyObject* first = kiln_register(e, regs, group[0]);
      if (first == nullptr) return 0;
      for (size_t k = 1; k < group.size(); ++k)
        if (kiln_register(e, regs, group[k]) != first) return 0;
      for (PyObject* other : firsts)
        if (other == first) return 0;
      firsts.push_back(first);
    }
    return 1;
  }
  PyObject* v = kiln_register(e, regs, c.reg);
  if (v == nullptr) return 0;
  switch (c.op) {
    case KOP_TENSOR: return kiln_tensor_passes(v, c.spec);
    case KOP_IS: return v == c.arg;
    case KOP_IS_NOT: return v != c.arg;
    case KOP_IS_REF: {
      // the referent, or None once freed: a freed object's address, reused by a new one, never passes
      PyObject* target = PyWeakref_GET_OBJECT(c.arg);
      return target != Py_None && v == target;
    }
    case KOP_TYPE_REF: {
      PyObject* target = PyWeakref_GET_OBJECT(c.arg);
      return target != Py_None && reinterpret_cast<PyObject*>(Py_TYPE(v)) == target;
    }
    case KOP_TYPE: return reinterpret_cast<PyObject*>(Py_TYPE(v)) == c.arg;
    case KOP_LEN: {
      Py_ssize_t n = PyObject_Size(v);
      return n < 0 ? -1 : n == c.n;
    }
    case KOP_VALUE: {
      if (Py_TYPE(v) != Py_TYPE(c.arg)) return 0;
      int same = PyObject_RichCompareBool(v, c.arg, Py_EQ);
      if (same != 1 || !PyFloat_CheckExact(v) || PyFloat_AS_DOUBLE(c.arg) != 0.0) return same;
      return std::signbit(PyFloat_AS_DOUBLE(v)) == std::signbit(PyFloat_AS_DOUBLE(c.arg));
    }
    case KOP_KEYS: {
      PyObject* both[] = {v, c.arg};
      PyObject* result = kiln_same_keys(nullptr, both, 2);
      if (result == nullptr) return -1;
      int truth = PyObject_IsTrue(result);
      Py_DECREF(result);
      return truth;
    }
    case KOP_ABSENT:
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c.arg); ++i) {
        int found = PySequence_Contains(v, PyTuple_GET_ITEM(c.arg, i));
        if (found != 0) return found < 0 ? -1 : 0;
      }
      return 1;
    default: return 0;
  }
}

static PyObject* kiln_entry_mismatch(KilnEntry* e, PyObject* const* args) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr) PyException_SetTraceback(value, tb);
  PyObject* given = PyTuple_New(e->nargs);
  if (given == nullptr) { Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb); return nullptr; }
  for (Py_ssize_t i = 0; i < e->nargs; ++i) { Py_INCREF(args[i]); PyTuple_SET_ITEM(given, i, args[i]); }
  PyObject* result = PyObject_CallFunctionObjArgs(e->on_mismatch, value, given, nullptr);
  Py_DECREF(given);
  Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
  return result;
}

// the hit of `alt`: count it, call its graph on its registers, its result at `out`
static PyObject* kiln_entry_run(KilnEntry* e, const KilnAlternative& alt, PyObject* entry, PyObject** regs,
                                PyObject* const* args) {
  static PyObject* glue_name = PyUnicode_InternFromString("glue");
  static PyObject* hits_name = PyUnicode_InternFromString("cache_hits");
  static PyObject* one = PyLong_FromLong(1);
  // the glue's namespace holds the runtime; the entry holds the glue (alive: the caller checked the
  // frame's list holds it, and holds it here in case a guard's read ran code that cleared the list)
  PyObject* glue = PyObject_GetAttr(entry, glue_name);
  if (glue == nullptr) return nullptr;
  PyObject* runtime = PyFunction_Check(glue) ? PyDict_GetItemWithError(PyFunction_GET_GLOBALS(glue), alt.runtime_name) : nullptr;
  Py_XINCREF(runtime);
  Py_DECREF(glue);
  if (runtime == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "kiln internal error: a fast entry's graph is gone");
    return nullptr;
  }
  PyObject* hits = PyObject_GetAttr(e->stats, hits_name);
  PyObject* more = hits == nullptr || one == nullptr ? nullptr : PyNumber_Add(hits, one);
  Py_XDECREF(hits);
  if (more == nullptr || PyObject_SetAttr(e->stats, hits_name, more) < 0) { Py_XDECREF(more); Py_DECREF(runtime); return nullptr; }
  Py_DECREF(more);
  c10::SmallVector<PyObject*, 16> graph_args;
  for (Py_ssize_t r : alt.graph_regs) graph_args.push_back(regs[r]);  // read by the caller
  PyObject* outs = PyObject_Vectorcall(runtime, graph_args.data(), graph_args.size(), nullptr);
  Py_DECREF(runtime);
  if (outs == nullptr) {
    if (PyErr_ExceptionMatches(e->mismatch)) return kiln_entry_mismatch(e, args);
    return nullptr;
  }
  if (alt.out < 0) return outs;
  PyObject* item = PySequence_GetItem(outs, alt.out);
  Py_DECREF(outs);
  return item;
}

static PyObject* kiln_entry_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* e = reinterpret_cast<KilnEntry*>(self);
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (e->slow == nullptr) {  // cleared by the collector: only reachable from a finalizer of its cycle
    PyErr_SetString(PyExc_RuntimeError, "kiln: a compiled function's entry was called after it was freed");
    return nullptr;
  }
  const auto& alts = *e->alts;
  bool same = (kwnames == nullptr || PyTuple_GET_SIZE(kwnames) == 0) && nargs == e->nargs
      && PyList_GET_SIZE(e->entries) == static_cast<Py_ssize_t>(alts.size());
  for (size_t i = 0; same && i < alts.size(); ++i)
    same = PyList_GET_ITEM(e->entries, i) == PyWeakref_GET_OBJECT(alts[i].ref);
  if (!same) return PyObject_Vectorcall(e->slow, args, nargsf, kwnames);
  Py_ssize_t first_load = e->nbound + e->nargs;
  c10::SmallVector<PyObject*, 32> regs(static_cast<size_t>(first_load) + e->loads->size(), nullptr);
  for (Py_ssize_t i = 0; i < e->nbound; ++i) regs[i] = PyTuple_GET_ITEM(e->bound, i);
  for (Py_ssize_t i = 0; i < nargs; ++i) regs[e->nbound + i] = args[i];
  const KilnAlternative* hit = nullptr;
  for (const auto& alt : alts) {
    bool passes = true;
    for (const auto& check : alt.checks) {
      int ok = kiln_check_passes(e, regs.data(), check);
      if (ok < 0) PyErr_Clear();  // a guard that cannot be evaluated fails, as in the Python check
      if (ok <= 0) { passes = false; break; }
    }
    if (passes) { hit = &alt; break; }
  }
  for (size_t k = 0; hit != nullptr && k < hit->graph_regs.size(); ++k)
    if (kiln_register(e, regs.data(), hit->graph_regs[k]) == nullptr) hit = nullptr;  // its glue raises there
  PyObject* entry = hit == nullptr ? nullptr : PyWeakref_GET_OBJECT(hit->ref);
  if (entry == Py_None) hit = nullptr;  // freed by a reset another thread ran while a guard read a value
  Py_XINCREF(entry);
  PyObject* result = hit == nullptr ? nullptr : kiln_entry_run(e, *hit, entry, regs.data(), args);
  Py_XDECREF(entry);
  for (size_t r = static_cast<size_t>(first_load); r < regs.size(); ++r)
    if (regs[r] != UNREADABLE_REGISTER) Py_XDECREF(regs[r]);
  if (hit == nullptr) return PyObject_Vectorcall(e->slow, args, nargsf, kwnames);
  return result;
}

// The entry holds the Python entry's `slow` function, whose globals hold the entry: a cycle, so the
// type takes part in the garbage collector (a compiled function dropped by its user is freed).
static int kiln_entry_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* e = reinterpret_cast<KilnEntry*>(self);
  Py_VISIT(e->slow); Py_VISIT(e->entries); Py_VISIT(e->refs); Py_VISIT(e->held); Py_VISIT(e->bound);
  Py_VISIT(e->stats); Py_VISIT(e->mismatch); Py_VISIT(e->on_mismatch); Py_VISIT(e->globals);
  return 0;
}

static int kiln_entry_clear(PyObject* self) {
  auto* e = reinterpret_cast<KilnEntry*>(self);
  Py_CLEAR(e->slow); Py_CLEAR(e->entries); Py_CLEAR(e->refs); Py_CLEAR(e->held); Py_CLEAR(e->bound);
  Py_CLEAR(e->stats); Py_CLEAR(e->mismatch); Py_CLEAR(e->on_mismatch); Py_CLEAR(e->globals);
  return 0;
}

static void kiln_entry_free(PyObject* self) {
  auto* e = reinterpret_cast<KilnEntry*>(self);
  PyObject_GC_UnTrack(self);
  kiln_entry_clear(self);
  delete e->loads;
  delete e->alts;
  PyObject_GC_Del(self);
}

static PyTypeObject kiln_entry_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// the registers of a tuple of ints, each below `limit`
static bool kiln_registers(PyObject* t, Py_ssize_t limit, std::vector<Py_ssize_t>* out) {
  if (!PyTuple_Check(t)) { PyErr_SetString(PyExc_TypeError, "frame_entry: registers are a tuple"); return false; }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) {
    Py_ssize_t r = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
    if (r == -1 && PyErr_Occurred()) return false;
    if (r < 0 || r >= limit) { PyErr_SetString(PyExc_ValueError, "frame_entry: a register out of range"); return false; }
    out->push_back(r);
  }
  return true;
}

static bool kiln_parse_check(PyObject* item, Py_ssize_t nregs, KilnCheck* c) {
  Py_ssize_t reg;
  if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "inO", &c->op, &reg, &c->arg)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "frame_entry: a check is (op, register, argument)");
    return false;
  }
  c->reg = reg;
  c->spec = nullptr;
  c->n = 0;
  bool needs_reg = c->op != KOP_GRAD && c->op != KOP_STATE && c->op != KOP_ALIAS && c->op != KOP_EXPR;
  if (needs_reg && (reg < 0 || reg >= nregs)) { PyErr_SetString(PyExc_ValueError, "frame_entry: a register out of range"); return false; }
  switch (c->op) {
    case KOP_TENSOR:
      c->spec = static_cast<KilnTensorSpec*>(PyCapsule_GetPointer(c->arg, "kiln.tensor_spec"));
      return c->spec != nullptr;
    case KOP_LEN:
      c->n = PyLong_AsSsize_t(c->arg);
      return !(c->n == -1 && PyErr_Occurred());
    case KOP_GRAD:
      if (PyBool_Check(c->arg)) return true;
      break;
    case KOP_STATE:
      if (PyTuple_Check(c->arg) && PyTuple_GET_SIZE(c->arg) == 2 && THPDtype_Check(PyTuple_GET_ITEM(c->arg, 0))
          && (PyTuple_GET_ITEM(c->arg, 1) == Py_None || THPDevice_Check(PyTuple_GET_ITEM(c->arg, 1))))
        return true;
      break;
    case KOP_VALUE:
      if (PyLong_CheckExact(c->arg) || PyFloat_CheckExact(c->arg) || PyUnicode_CheckExact(c->arg)) return true;
      break;
    case KOP_KEYS: case KOP_ABSENT:
      if (PyTuple_Check(c->arg)) return true;
      break;
    case KOP_ALIAS:
      if (!PyTuple_Check(c->arg)) break;
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c->arg); ++i) {
        std::vector<Py_ssize_t> group;
        if (!kiln_registers(PyTuple_GET_ITEM(c->arg, i), nregs, &group)) return false;
        if (group.empty()) break;
        c->groups.push_back(std::move(group));
      }
      if (static_cast<Py_ssize_t>(c->groups.size()) == PyTuple_GET_SIZE(c->arg)) return true;
      break;
    case KOP_EXPR: {
      PyObject *fn, *regs;
      if (!PyTuple_Check(c->arg) || !PyArg_ParseTuple(c->arg, "OO!", &fn, &PyTuple_Type, &regs)) break;
      std::vector<Py_ssize_t> used;
      if (!PyCallable_Check(fn) || !kiln_registers(regs, nregs, &used)) break;
      c->arg = fn;
      c->groups.push_back(std::move(used));
      return true;
    }
    case KOP_IS: case KOP_IS_NOT: case KOP_TYPE:
      return true;
    case KOP_IS_REF: case KOP_TYPE_REF:
      if (PyWeakref_CheckRef(c->arg)) return true;
      break;
    default: break;
  }
  PyErr_SetString(PyExc_ValueError, "frame_entry: a check's op or argument is not one it knows");
  return false;
}

static PyObject* kiln_frame_entry(PyObject*, PyObject* args) {
  PyObject *slow, *entries, *cached, *alternatives, *bound, *loads, *stats, *mismatch, *on_mismatch, *globals;
  Py_ssize_t nargs;
  if (!PyArg_ParseTuple(args, "OO!O!O!O!nO!OOOO!", &slow, &PyList_Type, &entries, &PyTuple_Type, &cached,
                        &PyTuple_Type, &alternatives, &PyTuple_Type, &bound, &nargs, &PyTuple_Type, &loads, &stats,
                        &mismatch, &on_mismatch, &PyDict_Type, &globals))
    return nullptr;
  if (PyTuple_GET_SIZE(cached) != PyTuple_GET_SIZE(alternatives) || PyTuple_GET_SIZE(cached) == 0 || nargs < 0) {
    PyErr_SetString(PyExc_ValueError, "frame_entry: one alternative per cached entry");
    return nullptr;
  }
  Py_ssize_t nbound = PyTuple_GET_SIZE(bound);
  Py_ssize_t first_load = nbound + nargs;
  Py_ssize_t nregs = first_load + PyTuple_GET_SIZE(loads);
  auto steps = std::make_unique<std::vector<KilnLoadStep>>();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(loads); ++i) {
    KilnLoadStep l;
    PyObject* item = PyTuple_GET_ITEM(loads, i);
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "niO", &l.src, &l.kind, &l.key)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "frame_entry: a load is (register, kind, key)");
      return nullptr;
    }
    bool reads = l.kind == 0 || l.kind == 1 || l.kind == 4;
    if (l.kind < 0 || l.kind > 4 || (reads && (l.src < 0 || l.src >= first_load + i))
        || ((l.kind == 0 || l.kind == 2 || l.kind == 4) && !PyUnicode_CheckExact(l.key))) {
      PyErr_SetString(PyExc_ValueError, "frame_entry: a load reads a later register or has no name");
      return nullptr;
    }
    steps->push_back(l);
  }
  auto alts = std::make_unique<std::vector<KilnAlternative>>();
  PyObject* refs = PyTuple_New(PyTuple_GET_SIZE(cached));
  if (refs == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(alternatives); ++i) {
    KilnAlternative alt;
    PyObject *checks, *graph_regs;
    PyObject* item = PyTuple_GET_ITEM(alternatives, i);
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "UO!O!n", &alt.runtime_name, &PyTuple_Type, &checks,
                                                  &PyTuple_Type, &graph_regs, &alt.out)
        || !kiln_registers(graph_regs, nregs, &alt.graph_regs)) {
      Py_DECREF(refs);
      return nullptr;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(checks); ++k) {
      KilnCheck c;
      if (!kiln_parse_check(PyTuple_GET_ITEM(checks, k), nregs, &c)) { Py_DECREF(refs); return nullptr; }
      alt.checks.push_back(std::move(c));
    }
    alt.ref = PyWeakref_NewRef(PyTuple_GET_ITEM(cached, i), nullptr);
    if (alt.ref == nullptr) { Py_DECREF(refs); return nullptr; }
    PyTuple_SET_ITEM(refs, i, alt.ref);
    alts->push_back(std::move(alt));
  }
  PyObject* held = PyTuple_Pack(2, alternatives, loads);  // what the checks and loads point into
  if (held == nullptr) { Py_DECREF(refs); return nullptr; }
  auto* e = PyObject_GC_New(KilnEntry, &kiln_entry_type);
  if (e == nullptr) { Py_DECREF(refs); Py_DECREF(held); return nullptr; }
  e->vectorcall = kiln_entry_call;
  PyObject* kept[] = {slow, entries, bound, stats, mismatch, on_mismatch, globals};
  for (PyObject* o : kept) Py_INCREF(o);
  e->slow = slow; e->entries = entries; e->refs = refs; e->held = held; e->bound = bound; e->stats = stats;
  e->mismatch = mismatch; e->on_mismatch = on_mismatch; e->globals = globals;
  e->loads = steps.release();
  e->alts = alts.release();
  e->nargs = nargs;
  e->nbound = nbound;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(e));
  return reinterpret_cast<PyObject*>(e);
}

static bool kiln_entry_ready() {
  if (kiln_entry_type.tp_flags & Py_TPFLAGS_READY) return true;
  kiln_entry_type.tp_name = "kiln_native.Entry";
  kiln_entry_type.tp_basicsize = sizeof(KilnEntry);
  kiln_entry_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
  kiln_entry_type.tp_traverse = kiln_entry_traverse;
  kiln_entry_type.tp_clear = kiln_entry_clear;
  kiln_entry_type.tp_vectorcall_offset = offsetof(KilnEntry, vectorcall);
  kiln_entry_type.tp_call = PyVectorcall_Call;
  kiln_entry_type.tp_dealloc = kiln_entry_free;
  kiln_entry_type.tp_doc = "a compiled function's fast entry (kiln.capture.fast_entry)";
  return PyType_Ready(&kiln_entry_type) == 0;
}

static PyMethodDef kiln_methods[] = {
  {"make", kiln_make, METH_VARARGS, "make(graph address, [kernel addresses], follow) -> handle"},
  {"make_plan", kiln_make_plan, METH_VARARGS, "make_plan(words, doubles, strings, ops, dtypes, sites, counts, "
   "[kernel entries], [constants], follow) -> handle"},
  {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_call)), METH_FASTCALL,
   "call(handle, *args) -> tuple"},
  {"steal", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_steal)), METH_FASTCALL,
   "steal(handle, list) -> tuple"},
  {"direct", kiln_direct, METH_VARARGS, "direct(handle, not_views, number of outputs, no_grad) -> callable"},
  {"frame_entry", kiln_frame_entry, METH_VARARGS, "frame_entry(slow, entries, cached, alternatives, bound, nargs, "
   "loads, stats, mismatch, on_mismatch, globals) -> callable"},
  {"state_ok", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_state_ok)), METH_FASTCALL,
   "state_ok(grad or None, dtype, device or None) -> bool"},
  {"tensor_spec", kiln_tensor_spec, METH_VARARGS, "tensor_spec(type, dtype, ...) -> spec"},
  {"tensor_ok", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_tensor_ok)), METH_FASTCALL,
   "tensor_ok(value, spec) -> bool"},
  {"same_keys", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_same_keys)), METH_FASTCALL,
   "same_keys(mapping, keys) -> bool"},
  {"empty_attrs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_empty_attrs)), METH_FASTCALL,
   "empty_attrs(obj, names) -> bool"},
  {"apply_node", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(kiln_apply_node)), METH_FASTCALL,
   "apply_node(forward, backward, create_graph, args, n_out, n_saved, non_diff, needs, detached) -> outputs"},
  {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef kiln_module = {PyModuleDef_HEAD_INIT, "kiln_native", nullptr, -1, kiln_methods};

extern "C" PyObject* kiln_native_module() {
  if (!kiln_direct_ready() || !kiln_entry_ready()) return nullptr;
  PyObject* module = PyModule_Create(&kiln_module);
  if (module != nullptr && PyModule_AddIntConstant(module, "frame_entry_ops", kiln_frame_entry_ops) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
