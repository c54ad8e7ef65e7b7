// autograd.cpp: ewkern.torch's eager autograd nodes in C++ (plain torch::autograd::Node), built at
// run time against the torch that imports it (ewkern/_torch_native/__init__.py) and loaded by
// ewkern.torch on the first call that needs a gradient.
//
// What it replaces: a Python torch.autograd.Function around each op, whose forward costs about
// 4 us and whose backward about 8-12 us more host time than torch's own C++ nodes on the GPU
// machines (scripts/host_step_probe.py). Here the forward and the backward launch ewkern's auto
// kernels through ewkern._C._native_api (ewkern_native.h: the registry's launchers, no Python, no
// GIL), on torch's current stream, into tensors from torch's allocator. The backward is the same
// one-kernel formula as ewkern.torch's FAST table; a backward that must itself be differentiable
// (create_graph=True) calls ewkern.torch's composed formula in Python (_composed_grads,
// _composed_rmse). rmse's node covers every axis= layout ewkern.rmse takes.
//
// Each op is a Python function made by make(name, fallback): it takes the plain case (tensors of
// torch.Tensor's own type, strided, on the cpu or a GPU of ewkern's build, float32/float16/
// bfloat16/float64, equal dtype/device/shape, float scalars) and gives anything else to fallback
// (ewkern.torch's Python path, which raises the errors or unwraps functorch's tensors).
//
// The nodes are plain torch::autograd::Node subclasses (EwNode, RmseNode), made as torch's generated
// code makes its own (edges, saved variables, the result's history), not torch::autograd::Function's
// CppNode. A user kernel made a custom op (ewkern.torch.kernel_op) gets a node of its own kind,
// UserNode: its forward and backward are Python callables (the kernel, and the derived backward
// kernel's wrapper), but the node is made here, not a Python torch.autograd.Function (whose
// forward and backward wrappers, context object and saved_tensors cost a step more host time than
// the kernels' own calls).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ewkern_native.h"

namespace ewkern {

using torch::autograd::variable_list;
using at::Tensor;

enum Saves { NONE, A, Y, AB };

// X(name, inputs, scalars, saves, backward kernel or nullptr)
#define EW_NATIVE_OPS(X)                                                                   \
    X(copy, 1, 0, NONE, nullptr) X(neg, 1, 0, NONE, nullptr) X(add_const, 1, 1, NONE, nullptr) \
    X(mul_const, 1, 1, NONE, nullptr) X(abs, 1, 0, A, "abs_backward")                      \
    X(exp, 1, 0, Y, "exp_backward") X(log, 1, 0, A, "log_backward")                        \
    X(sqrt, 1, 0, Y, "sqrt_backward") X(rsqrt, 1, 0, Y, "rsqrt_backward")                  \
    X(erf, 1, 0, A, "erf_backward") X(tanh, 1, 0, Y, "tanh_backward")                      \
    X(sigmoid, 1, 0, Y, "sigmoid_backward") X(relu, 1, 0, Y, "relu_backward")              \
    X(gelu, 1, 0, A, "gelu_backward") X(silu, 1, 0, A, "silu_backward")                    \
    X(add, 2, 0, NONE, nullptr) X(sub, 2, 0, NONE, nullptr)                                \
    X(mul, 2, 0, AB, "mul_backward") X(div, 2, 0, AB, "div_backward")                      \
    X(maximum, 2, 0, AB, "maximum_backward") X(minimum, 2, 0, AB, "minimum_backward")      \
    X(axpby, 2, 2, NONE, "axpby_backward")

enum Op {
#define EW_ENUM(n, i, s, sv, bw) OP_##n,
    EW_NATIVE_OPS(EW_ENUM)
#undef EW_ENUM
    NOPS
};

struct Spec {
    const char *name;
    int nin, nscal;
    Saves saves;
    const char *backward;
};

const Spec SPECS[NOPS] = {
#define EW_SPEC(n, i, s, sv, bw) {#n, i, s, sv, bw},
    EW_NATIVE_OPS(EW_SPEC)
#undef EW_SPEC
};

const ew_native_api *api = nullptr;
PyObject *composed = nullptr;          // ewkern.torch._composed_grads
PyObject *composed_rmse = nullptr;     // ewkern.torch._node_rmse(grad, saved, axis, need)
const void *FWD[NOPS][4][2];           // [op][dtype][cuda]: the op's auto kernel
const void *BWD[NOPS][4][2];           // its backward kernel (grads.def), where it has one
bool READY[NOPS][4][2];                // every kernel the op's forward and backward may launch
bool HAVE_CUDA = false;
std::atomic<long long> LAUNCHES{0};     // kernels launched (the tests count a backward's)

int dtype_index(at::ScalarType t)
{
    switch (t) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    case at::kDouble: return 3;
    default: return -1;
    }
}

// Run go() (a launch of kernel k) with like's device current and its stream, counted; a failure
// becomes a c10::Error naming the kernel.
template <class Go>
void on_device(const void *k, const Tensor &like, void **stream, int *device, Go go)
{
    LAUNCHES.fetch_add(1, std::memory_order_relaxed);
    c10::OptionalDeviceGuard guard;
    if (like.is_cuda()) {
        guard.reset_device(like.device());
        *device = like.device().index();
        *stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(like.device()).native_handle();
    }
    int err = go();
    if (err != 0) {
        char msg[512];
        api->describe_error(k, err, msg, sizeof msg);
        TORCH_CHECK(false, "ewkern.torch: ", msg);
    }
}

// Launch kernel table[dt][cuda] over like's elements: ins (contiguous, like's shape and dtype)
// into out (and out2, a second gradient), allocated here where wanted and left undefined where not.
void launch(const void *const table[4][2], const Tensor &like, std::initializer_list<const Tensor *> ins,
            Tensor *out, Tensor *out2, double c0 = 0, double c1 = 0)
{
    const int dt = dtype_index(like.scalar_type());
    const bool cuda = like.is_cuda();
    const void *k = table[dt][cuda];
    TORCH_CHECK(k != nullptr, "ewkern.torch: no kernel for this dtype and device");
    ew_native_launch a;
    std::memset(&a, 0, sizeof a);
    int i = 0;
    for (const Tensor *t : ins)
        a.in[i++] = t->data_ptr();
    if (out) {
        *out = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
        a.out = out->data_ptr();
    }
    if (out2) {
        *out2 = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
        a.out2 = out2->data_ptr();
    }
    a.n = like.numel();
    a.scalar[0] = c0;
    a.scalar[1] = c1;
    if (a.n == 0)
        return;
    on_device(k, like, &a.stream, &a.device, [&] { return api->launch(k, &a); });
}

Tensor run1(Op op, const Tensor &a, double c0 = 0, double c1 = 0)
{
    Tensor y;
    launch(FWD[op], a, {&a}, &y, nullptr, c0, c1);
    return y;
}

Tensor run2(Op op, const Tensor &a, const Tensor &b)
{
    Tensor y;
    launch(FWD[op], a, {&a, &b}, &y, nullptr);
    return y;
}

// The pending Python error's message (with its type's name: "TypeError: ..."), cleared.
std::string fetch_error(bool with_type)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *str = value ? PyObject_Str(value) : nullptr;
    std::string msg = str && PyUnicode_Check(str) ? PyUnicode_AsUTF8(str) : "an error in Python";
    if (type && with_type)
        msg = std::string(((PyTypeObject *)type)->tp_name) + ": " + msg;
    Py_XDECREF(str);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return msg;
}

// A backward whose graph is wanted (create_graph=True), or whose gradient the kernels cannot read
// (readable): ewkern.torch._composed_grads(name, grad, saved, scalars, need) in Python, the
// composed formula of differentiable ops (or, without grad mode, the backward kernels as custom ops).
// rmse (op nullptr): ewkern.torch._node_rmse(grad, saved, axis, need), axis the tuple lo..hi.
variable_list composed_grads(const Op *op, const Tensor &grad, const variable_list &saved, const double *c,
                             const bool *need, int64_t lo = 0, int64_t hi = -1)
{
    static const Spec rmse_spec = {"rmse", 2, 0, AB, "rmse_backward"};
    const Spec &s = op ? SPECS[*op] : rmse_spec;
    PyGILState_STATE gil = PyGILState_Ensure();
    variable_list res(s.nin);
    PyObject *saved_t = PyTuple_New((Py_ssize_t)saved.size());
    PyObject *scal = PyTuple_New(op ? s.nscal : hi - lo + 1 > 0 ? hi - lo + 1 : 0);
    PyObject *need_t = PyTuple_New(s.nin);
    PyObject *r = nullptr;
    std::string err;
    if (saved_t && scal && need_t) {
        for (size_t k = 0; k < saved.size(); k++)
            PyTuple_SET_ITEM(saved_t, k, THPVariable_Wrap(saved[k]));
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(scal); k++)   // rmse: the reduced axes
            PyTuple_SET_ITEM(scal, k, op ? PyFloat_FromDouble(c[k]) : PyLong_FromLongLong(lo + k));
        for (int k = 0; k < s.nin; k++)
            PyTuple_SET_ITEM(need_t, k, PyBool_FromLong(need[k]));
        PyObject *g = THPVariable_Wrap(grad);
        if (g)
            r = op ? PyObject_CallFunction(composed, "sOOOO", s.name, g, saved_t, scal, need_t)
                   : PyObject_CallFunction(composed_rmse, "OOOO", g, saved_t, scal, need_t);
        Py_XDECREF(g);
    }
    if (r && PyTuple_Check(r) && PyTuple_GET_SIZE(r) >= s.nin) {
        for (int k = 0; k < s.nin; k++) {
            PyObject *x = PyTuple_GET_ITEM(r, k);
            if (THPVariable_Check(x))
                res[k] = THPVariable_Unpack(x);
        }
    } else {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_composed_grads did not return a tuple of the gradients");
        err = fetch_error(false);
    }
    Py_XDECREF(r);
    Py_XDECREF(saved_t);
    Py_XDECREF(scal);
    Py_XDECREF(need_t);
    PyGILState_Release(gil);
    TORCH_CHECK(err.empty(), "ewkern.torch.", s.name, " (the composed backward): ", err);
    return res;
}

// Whether the kernels can read t's memory as its values: strided, on the cpu or (with CUDA
// kernels) a GPU, not batched (autograd.grad's is_grads_batched runs the backward under torch's
// legacy vmap) nor one of functorch's wrappers or a Python subclass, and without the negative bit
// (torch._neg_view, x.conj().imag of a real view: its memory holds -t). An incoming gradient that
// is not goes to Python (composed_grads), which runs the backward kernels as custom ops.
bool readable(const Tensor &t)
{
    if (!t.defined() || t.layout() != at::kStrided || t.is_neg())
        return false;
    if (!(t.is_cpu() || (t.is_cuda() && HAVE_CUDA)))
        return false;
    auto keys = t.key_set();
    return !(keys.has(c10::DispatchKey::FuncTorchGradWrapper) || keys.has(c10::DispatchKey::FuncTorchBatched) ||
             keys.has(c10::DispatchKey::Batched) || keys.has(c10::DispatchKey::Python));
}

// The one-kernel gradients (ewkern.torch's FAST table): grad contiguous, saved as the forward saved.
variable_list fast_grads(Op op, const Tensor &g, const variable_list &saved, const double *c, const bool *need)
{
    Tensor ga, gb;
    auto pair = [&](Op kernel_op) {             // both gradients (or the wanted ones) in one pass
        Tensor a = saved[0].contiguous(), b = saved[1].contiguous();
        launch(BWD[kernel_op], g, {&g, &a, &b}, need[0] ? &ga : nullptr, need[1] ? &gb : nullptr);
    };
    switch (op) {
    case OP_copy: case OP_add_const: return {g};
    case OP_neg: return {run1(OP_neg, g)};
    case OP_mul_const: return {run1(OP_mul_const, g, c[0])};
    case OP_add: return {g, g};
    case OP_sub: return {g, need[1] ? run1(OP_neg, g) : Tensor()};
    case OP_axpby:
        if (need[0] && need[1])
            launch(BWD[OP_axpby], g, {&g}, &ga, &gb, c[0], c[1]);
        else
            (need[0] ? ga : gb) = run1(OP_mul_const, g, c[need[0] ? 0 : 1]);
        return {ga, gb};
    case OP_mul:
        if (need[0] && need[1])
            pair(OP_mul);
        else
            (need[0] ? ga : gb) = run2(OP_mul, g, saved[need[0] ? 1 : 0].contiguous());
        return {ga, gb};
    case OP_div:
        if (need[1])
            pair(OP_div);
        else
            ga = run2(OP_div, g, saved[1].contiguous());
        return {ga, gb};
    case OP_maximum: case OP_minimum:
        pair(op);
        return {ga, gb};
    default: {                                  // one input, a backward kernel of grad and a or y
        Tensor s = saved[0].contiguous();
        launch(BWD[op], g, {&g, &s}, &ga, nullptr);
        return {ga};
    }
    }
}

// An op's forward kernel on t (nin tensors) and scalars c: the nodes' forward, and eager calls that
// need no gradient alone (no node).
Tensor forward_kernel(Op op, const Tensor *t, const double *c)
{
    Tensor ac = t[0].contiguous();
    if (SPECS[op].nin == 1)
        return run1(op, ac, c[0], c[1]);
    Tensor bc = t[1].contiguous(), y;
    launch(FWD[op], ac, {&ac, &bc}, &y, nullptr, c[0], c[1]);
    return y;
}

// An elementwise op's autograd node: a plain torch::autograd::Node, as torch's own generated nodes
// are (AddBackward0, ...), not a torch::autograd::Function's CppNode, whose context (an IValue map
// for the scalars, saved-variable lists, the inputs' metadata kept for materialising undefined
// gradients, a mutex) cost a step 4-5 us more host time than these on the CI host. Edges
// to each tensor input; saved what the backward reads (an input, or the result: saved after the
// result's history is set, as torch saves its outputs, so the saved result does not own its node).
struct EwNode : public torch::autograd::Node {
    const Op op;
    torch::autograd::SavedVariable saved[2];
    int nsaved = 0;
    double c[2] = {0, 0};

    explicit EwNode(Op o) : op(o) {}
    std::string name() const override { return std::string("ewkern::") + SPECS[op].name + "Backward"; }
    void release_variables() override
    {
        for (int k = 0; k < nsaved; k++)
            saved[k].reset_data();
    }

    variable_list apply(variable_list &&grads) override
    {
        const int nin = SPECS[op].nin;
        variable_list res(nin);
        if (!grads[0].defined())
            return res;
        variable_list s;
        for (int k = 0; k < nsaved; k++)
            s.push_back(saved[k].unpack(shared_from_this()));   // raises where freed or modified in place
        const bool need[2] = {task_should_compute_output(0), nin > 1 && task_should_compute_output(1)};
        variable_list g = at::GradMode::is_enabled() || !readable(grads[0])
                              ? composed_grads(&op, grads[0], s, c, need)
                              : fast_grads(op, grads[0].contiguous(), s, c, need);
        for (int k = 0; k < nin; k++)
            if (need[k])
                res[k] = g[k];
        return res;
    }
};

// An eager call's forward: the kernel alone where no gradient is wanted; else the kernel, then its
// node as the result's history.
Tensor record(Op op, const Tensor *t, const double *c)
{
    const Spec &s = SPECS[op];
    if (!(at::GradMode::is_enabled() && (t[0].requires_grad() || (s.nin == 2 && t[1].requires_grad()))))
        return forward_kernel(op, t, c);
    Tensor y;
    {
        at::AutoGradMode no_grad(false);        // a non-contiguous input's copy records nothing
        y = forward_kernel(op, t, c);
    }
    auto node = std::shared_ptr<EwNode>(new EwNode(op), torch::autograd::deleteNode);
    node->set_next_edges(s.nin == 1 ? torch::autograd::collect_next_edges(t[0])
                                    : torch::autograd::collect_next_edges(t[0], t[1]));
    node->c[0] = c[0];
    node->c[1] = c[1];
    if (s.saves == A || s.saves == AB)
        node->saved[node->nsaved++] = torch::autograd::SavedVariable(t[0], false);
    if (s.saves == AB)
        node->saved[node->nsaved++] = torch::autograd::SavedVariable(t[1], false);
    torch::autograd::set_history(y, node);
    if (s.saves == Y)
        node->saved[node->nsaved++] = torch::autograd::SavedVariable(y, true);
    return y;
}

// ---- rmse: the reduced axes are [lo, hi] (lo > hi: none), the batches the others ----------------

const void *RMSE[4][2], *RMSE_BWD[4][2];
struct Layout {
    int64_t outer = 1, n = 1, inner = 1;
    std::vector<int64_t> kept;         // the result's shape
};

Layout layout(const Tensor &a, int64_t lo, int64_t hi)
{
    Layout L;
    for (int64_t i = 0; i < a.dim(); i++) {
        const int64_t d = a.size(i);
        if (i >= lo && i <= hi) {
            L.n *= d;
            continue;
        }
        (i < lo ? L.outer : L.inner) *= d;
        L.kept.push_back(d);
    }
    return L;
}

// The launch arguments a and b (contiguous) and their layout fill; the rest is the caller's.
ew_native_rmse rmse_args(const Tensor &a, const Tensor &b, const Layout &L)
{
    ew_native_rmse x;
    std::memset(&x, 0, sizeof x);
    x.a = a.data_ptr();
    x.b = b.data_ptr();
    x.outer = L.outer;
    x.n = L.n;
    x.inner = L.inner;
    return x;
}

void run_rmse(const void *const table[4][2], const Tensor &a, ew_native_rmse &x)
{
    const void *k = table[dtype_index(a.scalar_type())][a.is_cuda()];
    TORCH_CHECK(k != nullptr, "ewkern.torch: no rmse kernel for this dtype and device");
    if (x.outer * x.inner == 0)
        return;
    on_device(k, a, &x.stream, &x.device, [&] { return api->launch_rmse(k, &x); });
}

// rmse over axes lo..hi (float32 result, float64 for float64 inputs): the node's forward kernel
Tensor rmse_forward(const Tensor &a, const Tensor &b, int64_t lo, int64_t hi)
{
    Tensor ac = a.contiguous(), bc = b.contiguous();
    Layout L = layout(ac, lo, hi);
    Tensor r = at::empty(L.kept, a.options().dtype(a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
    ew_native_rmse x = rmse_args(ac, bc, L);
    x.out = r.data_ptr();
    run_rmse(RMSE, ac, x);
    return r;
}

// rmse's node (a plain Node, as EwNode): a and b saved, and the result r (saved after its history).
struct RmseNode : public torch::autograd::Node {
    torch::autograd::SavedVariable a_, b_, r_;
    int64_t lo = 0, hi = -1;

    std::string name() const override { return "ewkern::RmseBackward"; }
    void release_variables() override
    {
        a_.reset_data();
        b_.reset_data();
        r_.reset_data();
    }

    variable_list apply(variable_list &&grads) override
    {
        variable_list res(2);
        if (!grads[0].defined())
            return res;
        auto self = shared_from_this();
        const variable_list saved = {a_.unpack(self), b_.unpack(self), r_.unpack(self)};
        const bool need[2] = {task_should_compute_output(0), task_should_compute_output(1)};
        if (at::GradMode::is_enabled() || !readable(grads[0])) {
            variable_list g = composed_grads(nullptr, grads[0], saved, nullptr, need, lo, hi);
            for (int k = 0; k < 2; k++)
                if (need[k])
                    res[k] = g[k];
            return res;
        }
        Tensor g = grads[0].contiguous(), a = saved[0].contiguous(), b = saved[1].contiguous();
        Tensor r = saved[2].contiguous();
        ew_native_rmse x = rmse_args(a, b, layout(a, lo, hi));
        x.grad = g.data_ptr();
        x.r = r.data_ptr();
        auto opts = a.options().memory_format(at::MemoryFormat::Contiguous);
        if (need[0]) {
            res[0] = at::empty(a.sizes(), opts);
            x.out = res[0].data_ptr();
        }
        if (need[1]) {
            res[1] = at::empty(a.sizes(), opts);
            x.out2 = res[1].data_ptr();
        }
        if (a.numel() > 0)
            run_rmse(RMSE_BWD, a, x);
        return res;
    }
};

Tensor rmse_record(const Tensor &a, const Tensor &b, int64_t lo, int64_t hi)
{
    if (!(at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())))
        return rmse_forward(a, b, lo, hi);
    Tensor r;
    {
        at::AutoGradMode no_grad(false);
        r = rmse_forward(a, b, lo, hi);
    }
    auto node = std::shared_ptr<RmseNode>(new RmseNode(), torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(a, b));
    node->lo = lo;
    node->hi = hi;
    node->a_ = torch::autograd::SavedVariable(a, false);
    node->b_ = torch::autograd::SavedVariable(b, false);
    torch::autograd::set_history(r, node);
    node->r_ = torch::autograd::SavedVariable(r, true);
    return r;
}

// ---- the Python side ----------------------------------------------------------------------------

// Whether t is a tensor the native path takes: torch.Tensor itself, readable by the kernels (the
// fallback resolves the negative bit and runs functorch's wrappers), without a forward-mode
// gradient.
bool plain(PyObject *obj)
{
    if (!THPVariable_CheckExact(obj))
        return false;
    const Tensor &t = THPVariable_Unpack(obj);
    if (!readable(t))
        return false;
    return !t._fw_grad(0).defined();    // a dual tensor (forward-mode AD): the Python path has the jvp
}

// A C++ exception caught here as the Python error (with the GIL held): torch's python_error, which
// Python code called from torch's C++ throws (a saved-tensor hook's exception, torch.utils.checkpoint's
// early stop), restored as it was raised, its error still set or persisted into it; a c10::Error or
// any other as a RuntimeError with its message. The op's caller then sees the hook's own exception,
// not a SystemError (a NULL result with an error set) or an empty RuntimeError.
void set_python_error(const std::exception &e)
{
    if (auto *pe = dynamic_cast<const python_error *>(&e)) {
        const_cast<python_error *>(pe)->restore();
        if (PyErr_Occurred())
            return;
    }
    if (PyErr_Occurred())   /* a C++ exception thrown over a Python error: the Python one stands */
        return;
    auto *ce = dynamic_cast<const c10::Error *>(&e);
    PyErr_SetString(PyExc_RuntimeError, ce ? ce->what_without_backtrace() : e.what());
}

// The node's forward, go(), as a Python result: a large CPU loop (or a launch into a full CUDA
// queue) runs without the GIL, as ewkern._C's calls do; a C++ error as set_python_error's.
template <class Go>
PyObject *run(int64_t numel, Go go)
{
    Tensor y;
    std::exception_ptr failed;
    PyThreadState *ts = numel > (1 << 16) ? PyEval_SaveThread() : nullptr;
    try {
        y = go();
    } catch (...) {
        failed = std::current_exception();
    }
    if (ts)
        PyEval_RestoreThread(ts);
    if (failed) {
        try {
            std::rethrow_exception(failed);
        } catch (const std::exception &e) {
            set_python_error(e);
        } catch (...) {
            PyErr_SetString(PyExc_RuntimeError, "ewkern.torch: an unknown C++ exception in an op's forward");
        }
        return nullptr;
    }
    return THPVariable_Wrap(y);
}

PyObject *call_rmse(PyObject *fallback, PyObject *const *args, Py_ssize_t nargs);

// self: (op index, fallback, eager; NOPS: rmse). args: the op's tensors, then its scalars. eager
// (make(name, fallback, True): every eager call of the Python face, not only those that need a
// gradient) also leaves dispatch modes and functorch transforms to the fallback, as the Python
// face's checks did. Either way the forward runs alone where no gradient is wanted (record).
PyObject *call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const Op op = (Op)PyLong_AsLong(PyTuple_GET_ITEM(self, 0));
    PyObject *fallback = PyTuple_GET_ITEM(self, 1);
    const bool eager = PyTuple_GET_ITEM(self, 2) == Py_True;
    // a dispatch mode on torch's stack (torch._C._len_torch_dispatch_stack) or a functorch transform
    // (whose first layer includes its front key in this thread's dispatch keys until the last pops)
    if (eager && (c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
                  c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)))
        return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    if (op == NOPS)                     // rmse
        return call_rmse(fallback, args, nargs);
    const Spec &s = SPECS[op];
    if (nargs != s.nin + s.nscal)
        return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    Tensor t[2];
    double c[2] = {0, 0};
    for (int k = 0; k < s.nin; k++) {
        if (!plain(args[k]))
            return PyObject_Vectorcall(fallback, args, nargs, nullptr);
        t[k] = THPVariable_Unpack(args[k]);
    }
    const int dt = dtype_index(t[0].scalar_type());
    if (dt < 0 || !READY[op][dt][t[0].is_cuda()])
        return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    if (s.nin == 2 && (t[1].scalar_type() != t[0].scalar_type() || t[1].device() != t[0].device() ||
                       t[1].sizes() != t[0].sizes()))
        return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    for (int k = 0; k < s.nscal; k++) {
        PyObject *x = args[s.nin + k];
        if (!(PyFloat_Check(x) || PyLong_Check(x)))
            return PyObject_Vectorcall(fallback, args, nargs, nullptr);
        c[k] = PyFloat_AsDouble(x);
        if (c[k] == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyObject_Vectorcall(fallback, args, nargs, nullptr);
        }
    }
    return run(t[0].numel(), [&] { return record(op, t, c); });
}

// rmse's: args a, b, axis (None, or a list or tuple of ints: the wrapper's); the reduced axes must
// be one run, as ewkern.rmse wants (anything else: the fallback, which raises ewkern's error).
PyObject *call_rmse(PyObject *fallback, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !plain(args[0]) || !plain(args[1]))
        return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    const Tensor &a = THPVariable_Unpack(args[0]), &b = THPVariable_Unpack(args[1]);
    const int dt = dtype_index(a.scalar_type());
    if (dt < 0 || !RMSE[dt][a.is_cuda()] || !RMSE_BWD[dt][a.is_cuda()] || b.scalar_type() != a.scalar_type() ||
        b.device() != a.device() || b.sizes() != a.sizes())
        return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    const int64_t nd = a.dim();
    int64_t lo = nd == 1 ? 0 : 1, hi = nd - 1;
    PyObject *axis = args[2];
    if (axis != Py_None) {
        if (!(PyList_Check(axis) || PyTuple_Check(axis)))
            return PyObject_Vectorcall(fallback, args, nargs, nullptr);
        PyObject *seq = PySequence_Fast(axis, "axis");
        if (seq == nullptr)
            return nullptr;
        const Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
        std::vector<bool> red(nd, false);
        bool ok = m <= nd;
        lo = nd;
        hi = -1;
        for (Py_ssize_t j = 0; ok && j < m; j++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, j);
            long long ax = PyLong_Check(item) ? PyLong_AsLongLong(item) : nd;
            if (ax == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                ax = nd;
            }
            if (ax < -nd || ax >= nd) {
                ok = false;
                break;
            }
            ax = ax < 0 ? ax + nd : ax;
            ok = !red[ax];
            red[ax] = true;
            lo = std::min<int64_t>(lo, ax);
            hi = std::max<int64_t>(hi, ax);
        }
        Py_DECREF(seq);
        ok = ok && (m == 0 || hi - lo + 1 == m);
        if (!ok)
            return PyObject_Vectorcall(fallback, args, nargs, nullptr);
    }
    if (lo > hi) {                    // nothing reduced: each element its own batch
        lo = nd;
        hi = nd - 1;
    }
    return run(a.numel(), [&] { return rmse_record(a, b, lo, hi); });
}

// ---- user kernels (ewkern.torch.kernel_op) ---------------------------------------------------------

// A run-time kernel's call as the native module repeats it without Python: the C plan the kernel
// recorded (ewkern/rtc/_kernel.py's native_plan, through kernel_op's plan functions), kept as data.
// pslots (offset, argument, bytes added) and sslots (offset, 0 float32 | 1 float64, argument) write
// the call's arguments into a copy of tmpl, the results in outs numbered after them; the last
// `hidden` results are scratch (a column sum's partial rows); prog is the launches (ew_rtc_run). A
// forward's kernel takes the op's arguments and has one result; a backward's takes (grad, the op's
// arguments) and its result j is the gradient of tensor input grad_of[j].
// A stage run before the plan's own launches (pre): its results, numbered after the arguments and
// the earlier stages' results, are scratch that later stages read (a ReductionKernel op's backward:
// the reduction again, then the kernel that writes the gradients).
struct UserStage {
    std::string tmpl;
    std::vector<int64_t> pslots, sslots, prog;
    std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> outs;
};

struct UserPlan : UserStage {
    size_t hidden = 0;
    std::vector<int> grad_of;
    std::vector<UserStage> pre;
};

using PlanKey = std::vector<int64_t>;
using PlanMap = std::map<PlanKey, std::shared_ptr<const UserPlan>>;

// One user op: kernel(*args) -> a Tensor (the op's forward, any layout); grads(grad, need, *args) ->
// a tuple with the gradient of each tensor argument (None where need, a tuple of bools, says it is
// not wanted); plan(grad, need, *args) and fplan(*args) -> the C plan the backward's or the
// forward's kernel just ran by, or None (either None itself: that kernel is never run natively).
// Tensors sit at tpos among nargs arguments; the others are float scalars. plans and fplans: the
// backward's and the forward's plan per signature (plan keys), null where the Python path runs it.
struct UserOp {
    PyObject *kernel = nullptr, *grads = nullptr, *fallback = nullptr, *plan = nullptr, *fplan = nullptr;
    std::vector<int> tpos, scalar_at;   // scalar_at: per argument, its index among the scalars or -1
    int nargs = 0;
    std::string name;
    std::mutex mu;
    PlanMap plans, fplans;
    ~UserOp()
    {
        if (!Py_IsInitialized())
            return;
        PyGILState_STATE gil = PyGILState_Ensure();
        Py_XDECREF(kernel);
        Py_XDECREF(grads);
        Py_XDECREF(fallback);
        Py_XDECREF(plan);
        Py_XDECREF(fplan);
        PyGILState_Release(gil);
    }

    // (whether key was seen, its plan: null where the Python path runs it)
    std::pair<bool, std::shared_ptr<const UserPlan>> find(const PlanMap &m, const PlanKey &key)
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = m.find(key);
        return it == m.end() ? std::make_pair(false, std::shared_ptr<const UserPlan>())
                             : std::make_pair(true, it->second);
    }

    void learn(PlanMap &m, PlanKey &&key, std::shared_ptr<const UserPlan> p)
    {
        std::lock_guard<std::mutex> lock(mu);
        if (m.size() >= USER_PLANS_MAX)
            m.clear();
        m[std::move(key)] = std::move(p);
    }
    static const size_t USER_PLANS_MAX = 64;   // plans a map keeps (a new one past this clears it)
};

// user backwards and forwards run from their plans (the tests count them)
std::atomic<long long> USER_PLAN_RUNS{0}, USER_FORWARD_RUNS{0};

// Append a tensor's part of a plan key: its dtype, sizes, device and address modulo 16 (what the
// kernel's C plan is keyed by). false where it is not contiguous (the Python path copies it first).
bool key_tensor(PlanKey &key, const Tensor &x)
{
    if (!x.is_contiguous())
        return false;
    key.push_back((int64_t)x.scalar_type());
    key.push_back(x.dim());
    for (int64_t d : x.sizes())
        key.push_back(d);
    key.push_back((int64_t)x.device().type());
    key.push_back(x.device().index());
    key.push_back((int64_t)((uintptr_t)x.data_ptr() & 15));
    return true;
}

// Read a stage, (template, pointer slots, scalar slots, outputs, program) at r's items from at, into
// st, its slots checked against the template and the numbering (first: the kernel's arguments
// before the op's, 1 for a backward's gradient; before: the earlier stages' results, numbered after
// the arguments): false (and no Python error) where it does not fit.
bool read_stage(PyObject *r, Py_ssize_t at, const UserOp &op, int first, int64_t before, UserStage &st)
{
    auto words = [](PyObject *b, std::vector<int64_t> &v) {
        if (!PyBytes_Check(b) || PyBytes_GET_SIZE(b) % 8)
            return false;
        v.resize(PyBytes_GET_SIZE(b) / 8);
        std::memcpy(v.data(), PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
        return true;
    };
    PyObject *tmpl = PyTuple_GET_ITEM(r, at), *outs = PyTuple_GET_ITEM(r, at + 3);
    if (!PyBytes_Check(tmpl) || !words(PyTuple_GET_ITEM(r, at + 1), st.pslots) ||
        !words(PyTuple_GET_ITEM(r, at + 2), st.sslots) || !words(PyTuple_GET_ITEM(r, at + 4), st.prog) ||
        !PyTuple_Check(outs))
        return false;
    st.tmpl.assign(PyBytes_AS_STRING(tmpl), PyBytes_GET_SIZE(tmpl));
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(outs); j++) {
        PyObject *o = PyTuple_GET_ITEM(outs, j);
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(o, 0)) ||
            !PyTuple_Check(PyTuple_GET_ITEM(o, 1)))
            return false;
        const std::string dt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(o, 0));
        const at::ScalarType t = dt == "float32" ? at::kFloat : dt == "float16" ? at::kHalf
                               : dt == "bfloat16" ? at::kBFloat16 : dt == "float64" ? at::kDouble : at::kByte;
        if (t == at::kByte)
            return false;
        std::vector<int64_t> shape;
        PyObject *shp = PyTuple_GET_ITEM(o, 1);
        for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shp); d++) {
            shape.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shp, d)));
            if (shape.back() < 0) {
                PyErr_Clear();
                return false;
            }
        }
        st.outs.emplace_back(t, std::move(shape));
    }
    const int64_t len = (int64_t)st.tmpl.size(), nnum = first + op.nargs + before + (int64_t)st.outs.size();
    if (st.pslots.size() % 3 || st.sslots.size() % 3)
        return false;
    for (size_t j = 0; j < st.pslots.size(); j += 3)
        if (st.pslots[j] < 0 || st.pslots[j] + 8 > len || st.pslots[j + 1] < 0 || st.pslots[j + 1] >= nnum)
            return false;
    for (size_t j = 0; j < st.sslots.size(); j += 3) {
        const int64_t k = st.sslots[j + 2] - first;
        if (st.sslots[j] < 0 || st.sslots[j] + 8 > len || k < 0 || k >= op.nargs || op.scalar_at[k] < 0)
            return false;
    }
    return true;
}

// Read a plan function's answer, (template, pointer slots, scalar slots, outputs, program, hidden,
// grad_of[, stages run first as (template, pointer slots, scalar slots, outputs, program) each]),
// into a UserPlan (read_stage's checks; a forward has one result and no earlier stage): null (and
// no Python error) where it is None or does not fit.
std::shared_ptr<const UserPlan> read_plan(PyObject *r, const UserOp &op, int first)
{
    if (r == nullptr || !PyTuple_Check(r) || (PyTuple_GET_SIZE(r) != 7 && PyTuple_GET_SIZE(r) != 8))
        return nullptr;
    auto p = std::make_shared<UserPlan>();
    int64_t before = 0;
    if (PyTuple_GET_SIZE(r) == 8) {
        PyObject *pre = PyTuple_GET_ITEM(r, 7);
        if (!first || !PyTuple_Check(pre))
            return nullptr;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(pre); j++) {
            PyObject *stage = PyTuple_GET_ITEM(pre, j);
            p->pre.emplace_back();
            if (!PyTuple_Check(stage) || PyTuple_GET_SIZE(stage) != 5 ||
                !read_stage(stage, 0, op, first, before, p->pre.back()))
                return nullptr;
            before += (int64_t)p->pre.back().outs.size();
        }
    }
    PyObject *grad_of = PyTuple_GET_ITEM(r, 6);
    if (!PyTuple_Check(grad_of) || !PyTuple_Check(PyTuple_GET_ITEM(r, 3)) || !read_stage(r, 0, op, first, before, *p))
        return nullptr;
    const long hidden = PyLong_AsLong(PyTuple_GET_ITEM(r, 5));
    const Py_ssize_t shown = (Py_ssize_t)p->outs.size() - hidden;
    if (hidden < 0 || shown < 1 || (!first && shown != 1) || PyTuple_GET_SIZE(grad_of) != (first ? shown : 0)) {
        PyErr_Clear();
        return nullptr;
    }
    p->hidden = (size_t)hidden;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(grad_of); j++) {
        const long t = PyLong_AsLong(PyTuple_GET_ITEM(grad_of, j));
        if (t < 0 || (size_t)t >= op.tpos.size()) {
            PyErr_Clear();
            return nullptr;
        }
        p->grad_of.push_back((int)t);
    }
    return p;
}

// Run one stage: its results allocated like `like` (appended to ptrs and to news), its argument
// struct written (the scalars from the op's, scalars), its launches made on stream (the GIL
// released around them where this thread holds it).
void run_stage(const UserOp &op, const UserStage &st, const Tensor &like, std::vector<uint64_t> &ptrs,
               std::vector<Tensor> &news, const std::vector<double> &scalars, int first, void *stream)
{
    for (const auto &o : st.outs) {
        news.push_back(at::empty(o.second, like.options().dtype(o.first)));
        ptrs.push_back((uint64_t)(uintptr_t)news.back().data_ptr());
    }
    std::string buf = st.tmpl;
    for (size_t j = 0; j < st.pslots.size(); j += 3) {
        const uint64_t v = ptrs[st.pslots[j + 1]] + (uint64_t)st.pslots[j + 2];
        std::memcpy(&buf[st.pslots[j]], &v, 8);
    }
    for (size_t j = 0; j < st.sslots.size(); j += 3) {
        const double v = scalars[op.scalar_at[st.sslots[j + 2] - first]];
        const float f = (float)v;
        std::memcpy(&buf[st.sslots[j]], st.sslots[j + 1] ? (const void *)&v : (const void *)&f,
                    st.sslots[j + 1] ? 8 : 4);
    }
    char msg[256] = "";
    auto run = [&] {
        return api->rtc_run(st.prog.data(), (int64_t)st.prog.size(), &buf[0], (int64_t)buf.size(), stream, msg,
                            sizeof msg);
    };
    int err;
    if (PyGILState_Check()) {
        Py_BEGIN_ALLOW_THREADS
        err = run();
        Py_END_ALLOW_THREADS
    } else {
        err = run();
    }
    TORCH_CHECK(err == 0, "ewkern.torch (", op.name, "): ", msg);
}

// Run a plan: ptrs holds the kernel's arguments' addresses (first + the op's arguments; 0 for a
// scalar); its earlier stages run first, their results scratch; then its own launches, whose
// results (shown, then scratch) it returns; all on torch's current stream of like's device.
std::vector<Tensor> run_user_plan(const UserOp &op, const UserPlan &p, const Tensor &like, std::vector<uint64_t> ptrs,
                                  const std::vector<double> &scalars, int first)
{
    c10::OptionalDeviceGuard guard;
    void *stream = nullptr;
    if (like.is_cuda()) {
        guard.reset_device(like.device());
        stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(like.device()).native_handle();
    }
    std::vector<Tensor> scratch, news;
    for (const UserStage &st : p.pre)
        run_stage(op, st, like, ptrs, scratch, scalars, first, stream);
    news.reserve(p.outs.size());
    run_stage(op, p, like, ptrs, news, scalars, first, stream);
    (first ? USER_PLAN_RUNS : USER_FORWARD_RUNS).fetch_add(1, std::memory_order_relaxed);
    return news;
}

struct UserNode : public torch::autograd::Node {
    std::shared_ptr<UserOp> op;
    std::vector<torch::autograd::SavedVariable> saved;   // the tensor arguments
    std::vector<double> scalars;                         // the others, in order

    explicit UserNode(std::shared_ptr<UserOp> o) : op(std::move(o)) {}
    std::string name() const override { return "ewkern_user::" + op->name + "Backward"; }
    void release_variables() override
    {
        for (auto &s : saved)
            s.reset_data();
    }

    variable_list apply(variable_list &&grads) override
    {
        const size_t nt = op->tpos.size();
        variable_list res(nt);
        if (!grads[0].defined())
            return res;
        if (grads[0].is_neg())          // the kernels read memory, which holds -grad
            grads[0] = grads[0].resolve_neg();
        std::vector<Tensor> ins;
        ins.reserve(nt);
        for (auto &s : saved)
            ins.push_back(s.unpack(shared_from_this()));   // raises where freed or modified in place
        // the plan of this signature, where the kernel recorded one: no Python (a double backward,
        // create_graph, takes the Python path, which refuses it)
        PlanKey key;
        if (op->plan != Py_None && nt < 62 && !at::GradMode::is_enabled()) {
            int64_t need = 0;
            for (size_t k = 0; k < nt; k++)
                need |= (int64_t)task_should_compute_output(k) << k;
            key.push_back(need);
            for (size_t t = 0; t <= nt && !key.empty(); t++)
                if (!key_tensor(key, t ? ins[t - 1] : grads[0]))
                    key.clear();
            if (!key.empty()) {
                auto found = op->find(op->plans, key);
                if (found.second)
                    return run_plan(*found.second, grads[0], ins);
                if (found.first)
                    key.clear();
            }
        }
        std::string err;
        std::shared_ptr<const UserPlan> learned;
        PyGILState_STATE gil = PyGILState_Ensure();
        PyObject *args = PyTuple_New(2 + op->nargs), *r = nullptr;
        if (args) {
            PyTuple_SET_ITEM(args, 0, THPVariable_Wrap(grads[0]));
            PyObject *need = PyTuple_New((Py_ssize_t)nt);
            for (size_t k = 0; need && k < nt; k++)
                PyTuple_SET_ITEM(need, k, PyBool_FromLong(task_should_compute_output(k)));
            PyTuple_SET_ITEM(args, 1, need);
            size_t t = 0, c = 0;
            for (int k = 0; k < op->nargs; k++) {
                const bool tensor = t < nt && op->tpos[t] == k;
                PyTuple_SET_ITEM(args, 2 + k, tensor ? THPVariable_Wrap(ins[t++]) : PyFloat_FromDouble(scalars[c++]));
            }
            if (need)
                r = PyObject_CallObject(op->grads, args);
        }
        if (r && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == (Py_ssize_t)nt) {
            for (size_t k = 0; k < nt; k++) {
                PyObject *x = PyTuple_GET_ITEM(r, k);
                if (THPVariable_Check(x))
                    res[k] = THPVariable_Unpack(x);
                else if (x != Py_None && err.empty())
                    err = "the backward returned a " + std::string(Py_TYPE(x)->tp_name) + " for a gradient";
            }
        } else if (PyErr_Occurred()) {
            err = fetch_error(true);
        } else {
            err = "the backward did not return a tuple of " + std::to_string(nt) + " gradients";
        }
        if (err.empty() && !key.empty()) {   // what the kernel just ran by, for the next call
            PyObject *pr = PyObject_CallObject(op->plan, args);
            if (pr == nullptr)
                err = fetch_error(true);
            else
                learned = read_plan(pr, *op, 1);
            Py_XDECREF(pr);
        }
        Py_XDECREF(r);
        Py_XDECREF(args);
        PyGILState_Release(gil);
        TORCH_CHECK(err.empty(), "ewkern.torch (", op->name, "'s backward): ", err);
        if (!key.empty())
            op->learn(op->plans, std::move(key), std::move(learned));
        return res;
    }

    // The backward by its plan: each gradient shaped as its input (a broadcast input's summed to
    // its shape, as the Python path does).
    variable_list run_plan(const UserPlan &p, const Tensor &g, const std::vector<Tensor> &ins)
    {
        std::vector<uint64_t> ptrs(1 + (size_t)op->nargs, 0);
        ptrs[0] = (uint64_t)(uintptr_t)g.data_ptr();
        for (size_t t = 0; t < ins.size(); t++)
            ptrs[1 + op->tpos[t]] = (uint64_t)(uintptr_t)ins[t].data_ptr();
        std::vector<Tensor> news = run_user_plan(*op, p, g, std::move(ptrs), scalars, 1);
        variable_list res(op->tpos.size());
        for (size_t j = 0; j < p.grad_of.size(); j++) {
            const Tensor &x = ins[p.grad_of[j]];
            Tensor gt = std::move(news[j]);
            if (gt.sizes() != x.sizes())
                gt = gt.numel() == x.numel() ? gt.view(x.sizes()) : at::sum_to(gt, x.sizes());
            res[p.grad_of[j]] = std::move(gt);
        }
        return res;
    }
};

// The forward's result: by its plan where the op's signature has one (no Python), else the kernel
// called (and, where fplan may give one, its plan learned for the next call). New reference.
PyObject *user_forward(UserOp &op, PyObject *const *args, Py_ssize_t nargs, const variable_list &tensors,
                       const std::vector<double> &scalars)
{
    PlanKey key;
    if (op.fplan != Py_None && !tensors.empty()) {
        key.push_back(-1);
        for (const Tensor &x : tensors)
            if (!key_tensor(key, x)) {
                key.clear();
                break;
            }
    }
    if (!key.empty()) {
        auto found = op.find(op.fplans, key);
        if (found.second) {
            std::vector<uint64_t> ptrs((size_t)op.nargs, 0);
            for (size_t t = 0; t < tensors.size(); t++)
                ptrs[op.tpos[t]] = (uint64_t)(uintptr_t)tensors[t].data_ptr();
            try {
                return THPVariable_Wrap(run_user_plan(op, *found.second, tensors[0], std::move(ptrs), scalars, 0)[0]);
            } catch (const std::exception &e) {
                set_python_error(e);
                return nullptr;
            }
        }
        if (found.first)
            key.clear();
    }
    PyObject *y = PyObject_Vectorcall(op.kernel, args, nargs, nullptr);
    if (y != nullptr && !key.empty()) {
        PyObject *pr = PyObject_Vectorcall(op.fplan, args, nargs, nullptr);
        if (pr == nullptr) {
            Py_DECREF(y);
            return nullptr;
        }
        op.learn(op.fplans, std::move(key), read_plan(pr, op, 0));
        Py_DECREF(pr);
    }
    return y;
}

// self: a capsule of the std::shared_ptr<UserOp>. The plain case (the op's argument count, plain
// tensors without forward-mode gradients, float or int scalars) runs the forward and, where a
// tensor needs a gradient, records a UserNode; anything else goes to the fallback (the Python
// Function).
PyObject *call_user(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    auto &op = *(std::shared_ptr<UserOp> *)PyCapsule_GetPointer(self, "ewkern.user_op");
    if (nargs != op->nargs)
        return PyObject_Vectorcall(op->fallback, args, nargs, nullptr);
    variable_list tensors;
    std::vector<double> scalars;
    size_t t = 0;
    for (int k = 0; k < nargs; k++) {
        if (t < op->tpos.size() && op->tpos[t] == k) {
            if (!plain(args[k]))
                return PyObject_Vectorcall(op->fallback, args, nargs, nullptr);
            tensors.push_back(THPVariable_Unpack(args[k]));
            t++;
            continue;
        }
        if (!(PyFloat_Check(args[k]) || PyLong_Check(args[k])))
            return PyObject_Vectorcall(op->fallback, args, nargs, nullptr);
        const double v = PyFloat_AsDouble(args[k]);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyObject_Vectorcall(op->fallback, args, nargs, nullptr);
        }
        scalars.push_back(v);
    }
    PyObject *y = user_forward(*op, args, nargs, tensors, scalars);
    if (y == nullptr || !THPVariable_CheckExact(y))
        return y;   // an error, or (not from kernel_op's kernels) no tensor: no graph
    const Tensor &out = THPVariable_Unpack(y);
    if (!at::GradMode::is_enabled() || !torch::autograd::any_variable_requires_grad(tensors) ||
        !torch::autograd::isDifferentiableType(out.scalar_type()))
        return y;
    try {
        auto node = std::shared_ptr<UserNode>(new UserNode(op), torch::autograd::deleteNode);
        torch::autograd::edge_list edges;
        for (const Tensor &x : tensors)
            edges.push_back(torch::autograd::impl::gradient_edge(x));
        node->set_next_edges(std::move(edges));
        for (const Tensor &x : tensors)
            node->saved.emplace_back(x, false);
        node->scalars = std::move(scalars);
        torch::autograd::set_history(out, node);
    } catch (const std::exception &e) {
        Py_DECREF(y);
        set_python_error(e);
        return nullptr;
    }
    return y;
}

PyMethodDef call_user_def = {"user_op", (PyCFunction)(void (*)(void))call_user, METH_FASTCALL,
                             "a user kernel's op through its C++ autograd node (plain tensors), else the fallback."};

void drop_user_op(PyObject *cap)
{
    delete (std::shared_ptr<UserOp> *)PyCapsule_GetPointer(cap, "ewkern.user_op");
}

// make_user(name, kernel, grads, tensor positions, nargs, fallback, plan=None, fplan=None) -> the
// op's function
PyObject *make_user(PyObject *, PyObject *args)
{
    const char *name;
    PyObject *kernel, *grads, *tpos, *fallback, *plan = Py_None, *fplan = Py_None;
    int nargs;
    if (!PyArg_ParseTuple(args, "sOOO!iO|OO", &name, &kernel, &grads, &PyTuple_Type, &tpos, &nargs, &fallback, &plan,
                          &fplan))
        return nullptr;
    auto op = std::make_shared<UserOp>();
    op->name = name;
    op->nargs = nargs;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(tpos); k++) {
        const long p = PyLong_AsLong(PyTuple_GET_ITEM(tpos, k));
        if (p == -1 && PyErr_Occurred())
            return nullptr;
        if (p < 0 || p >= nargs || (k && p <= op->tpos.back())) {
            PyErr_SetString(PyExc_ValueError, "make_user: tensor positions must increase within the arguments");
            return nullptr;
        }
        op->tpos.push_back((int)p);
    }
    for (int k = 0, c = 0, t = 0; k < nargs; k++) {
        const bool tensor = t < (int)op->tpos.size() && op->tpos[t] == k;
        t += tensor;
        op->scalar_at.push_back(tensor ? -1 : c++);
    }
    op->kernel = Py_NewRef(kernel);
    op->grads = Py_NewRef(grads);
    op->fallback = Py_NewRef(fallback);
    op->plan = Py_NewRef(plan);
    op->fplan = Py_NewRef(fplan);
    PyObject *cap = PyCapsule_New(new std::shared_ptr<UserOp>(op), "ewkern.user_op", drop_user_op);
    if (cap == nullptr)
        return nullptr;
    PyObject *fn = PyCFunction_New(&call_user_def, cap);
    Py_DECREF(cap);
    return fn;
}

PyMethodDef call_def = {"op", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
                        "ewkern.torch's op through its C++ autograd node (plain tensors), else the fallback."};

// init(capsule, composed_grads, composed_rmse): resolve every kernel once.
PyObject *init(PyObject *, PyObject *args)
{
    PyObject *cap, *comp, *comp_rmse;
    if (!PyArg_ParseTuple(args, "OOO", &cap, &comp, &comp_rmse))
        return nullptr;
    auto *p = (const ew_native_api *)PyCapsule_GetPointer(cap, "ewkern._C._native_api");
    if (p == nullptr)
        return nullptr;
    if (p->version != EW_NATIVE_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "ewkern._C._native_api is version %d, this module needs %d", p->version,
                     EW_NATIVE_API_VERSION);
        return nullptr;
    }
    api = p;
    Py_XSETREF(composed, Py_NewRef(comp));
    Py_XSETREF(composed_rmse, Py_NewRef(comp_rmse));
    for (int dt = 0; dt < 4; dt++)
        for (int cuda = 0; cuda < 2; cuda++) {
            RMSE[dt][cuda] = api->auto_kernel("rmse", dt, cuda);
            RMSE_BWD[dt][cuda] = api->auto_kernel("rmse_backward", dt, cuda);
        }
    for (int op = 0; op < NOPS; op++)
        for (int dt = 0; dt < 4; dt++)
            for (int cuda = 0; cuda < 2; cuda++) {
                FWD[op][dt][cuda] = api->auto_kernel(SPECS[op].name, dt, cuda);
                BWD[op][dt][cuda] = SPECS[op].backward ? api->auto_kernel(SPECS[op].backward, dt, cuda) : nullptr;
            }
    // what each op's backward may launch besides its own kernels
    for (int op = 0; op < NOPS; op++)
        for (int dt = 0; dt < 4; dt++)
            for (int cuda = 0; cuda < 2; cuda++) {
                auto has = [&](int o) { return FWD[o][dt][cuda] != nullptr; };
                bool ok = has(op) && (SPECS[op].backward == nullptr || BWD[op][dt][cuda] != nullptr);
                if (op == OP_neg || op == OP_sub)
                    ok = ok && has(OP_neg);
                if (op == OP_mul_const || op == OP_axpby)
                    ok = ok && has(OP_mul_const);
                READY[op][dt][cuda] = ok;
                HAVE_CUDA = HAVE_CUDA || (cuda && ok);
            }
    Py_RETURN_NONE;
}

// make(name, fallback, eager=False) -> the op's function (eager: see call)
PyObject *make(PyObject *, PyObject *args)
{
    const char *name;
    PyObject *fallback;
    int eager = 0;
    if (!PyArg_ParseTuple(args, "sO|p", &name, &fallback, &eager))
        return nullptr;
    for (int op = 0; op <= NOPS; op++)              // NOPS: rmse
        if (std::strcmp(op < NOPS ? SPECS[op].name : "rmse", name) == 0) {
            PyObject *self = Py_BuildValue("(iOO)", op, fallback, eager ? Py_True : Py_False);
            if (self == nullptr)
                return nullptr;
            PyObject *fn = PyCFunction_New(&call_def, self);
            Py_DECREF(self);
            return fn;
        }
    PyErr_Format(PyExc_KeyError, "ewkern.torch's native module has no op %s", name);
    return nullptr;
}

PyObject *names(PyObject *, PyObject *)
{
    PyObject *t = PyTuple_New(NOPS + 1);
    for (int op = 0; t && op <= NOPS; op++)
        PyTuple_SET_ITEM(t, op, PyUnicode_FromString(op < NOPS ? SPECS[op].name : "rmse"));
    return t;
}

PyObject *launches(PyObject *, PyObject *)
{
    return PyLong_FromLongLong(LAUNCHES.load());
}

PyObject *user_plan_runs(PyObject *, PyObject *)
{
    return PyLong_FromLongLong(USER_PLAN_RUNS.load());
}

PyObject *user_forward_runs(PyObject *, PyObject *)
{
    return PyLong_FromLongLong(USER_FORWARD_RUNS.load());
}

PyMethodDef methods[] = {
    {"launches", launches, METH_NOARGS, "how many kernels this module has launched (for the tests)"},
    {"init", init, METH_VARARGS, "init(ewkern._C._native_api, composed_grads, composed_rmse): resolve the kernels"},
    {"make", make, METH_VARARGS, "make(name, fallback, eager=False): the op's function"},
    {"make_user", make_user, METH_VARARGS,
     "make_user(name, kernel, grads, tensor positions, nargs, fallback, plan=None, fplan=None): a user op's function"},
    {"user_plan_runs", user_plan_runs, METH_NOARGS, "how many user backwards ran from their plan (for the tests)"},
    {"user_forward_runs", user_forward_runs, METH_NOARGS, "how many user forwards ran from their plan (for the tests)"},
    {"names", names, METH_NOARGS, "the ops this module runs"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_ewkern_torch_native",
                         "ewkern.torch's autograd nodes in C++ (built at run time against this torch).", -1,
                         methods};

}  // namespace ewkern

PyMODINIT_FUNC PyInit__ewkern_torch_native(void) { return PyModule_Create(&ewkern::moduledef); }
