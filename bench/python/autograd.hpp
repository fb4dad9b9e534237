// attnbench.autograd (bench/python/README.md): attnbench's attention as a torch.autograd.Function over the
// module's forward()/backward() (float32) and reference()/reference_backward() (float64), written in Python
// and executed into the submodule when attnbench is imported. torch is imported only when the Function is
// first used, so `import attnbench` works without torch.
#pragma once
#include <pybind11/eval.h>
#include <pybind11/pybind11.h>

namespace attn::python {

// attnbench.autograd, in Python: attnbench's attention as a torch.autograd.Function. Executed in the
// submodule's namespace when attnbench is imported; torch is imported only when the Function is first used,
// so the module imports without torch. `_attnbench` is the module itself.
inline constexpr const char* kAutogradSource = R"PY(
"""attnbench's attention as a torch.autograd.Function (torch is imported on first use).

attention_function(variant, q, k, v, **options) -> torch.Tensor, differentiable in q, k and v; the class is
attnbench.autograd.Attention (Attention.apply(q, k, v, g, beta, initial_state, sink_logits, variant,
options), the four None when not given). See attention_function's help."""
import warnings as _warnings

_OPTIONS = ("causal", "causal_lower_right", "mask", "key_padding", "scale", "dropout", "seed", "params",
            "threads", "isa", "dtype", "alibi", "alibi_slopes", "softcap")
# Inputs beyond q, k, v that get a gradient (a recurrence's g, beta, initial_state; sink logits), in the
# order backward() and reference_backward() return their gradients after dv.
_EXTRA = ("g", "beta", "initial_state", "sink_logits")
_KERNEL_ONLY = ("threads", "isa", "dtype")  # the float32 kernels' settings: no meaning for the fp64 definition
_function = None

_DOC = """attnbench attention as a torch.autograd.Function: forward(ctx, q, k, v, g, beta, initial_state,
sink_logits, variant, options) (each of the four None when not given), with backward giving dq, dk, dv (dk and
dv of K's shape: grouped-query heads summed over their group) and dg, dbeta, d_initial_state, d_sink_logits
for those given.

float32 tensors run the variant's fp32 kernels: the training forward (forward(..., save_state=True); O and
the saved state are kept in ctx), then backward(..., out=O, state=state): the gradients are
attnbench.backward's, bit for bit.
float64 tensors run the variant's fp64 definition instead: reference(..., variant=variant) forward and
reference_backward() backward. That definition is what the fp32 kernels are tested against (`attnbench
check`, `eval --compare`): exact in double, but on the float32 values of q, k, v and dO (the interface's
reference reads float32), so float64 values not exact in float32 are rounded (a RuntimeWarning says so).
torch.autograd.gradcheck therefore needs inputs and steps exact in float32, e.g. inputs that are multiples
of 2^-6 and eps=2**-10; it then passes (the analytic fp64 gradient against central differences).
Without an input requiring a gradient, float32 runs the inference forward (forward()), so a variant without
backward still runs; with one, the variant needs a backward (ValueError otherwise)."""


def _check_tensors(torch, q, k, v, extra=()):
    for name, t in (("q", q), ("k", k), ("v", v)) + tuple(extra):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.device.type != "cpu":
            raise ValueError("%s: on device '%s'; attnbench runs on the CPU (move it with .cpu())" % (name, t.device))
    dtypes = [q.dtype, k.dtype, v.dtype]
    if len(set(dtypes)) != 1 or dtypes[0] not in (torch.float32, torch.float64):
        raise ValueError("q, k, v: dtypes %s; expected float32 (the fp32 kernels) or float64 (the fp64 "
                         "definition), the same for all three" % ", ".join(str(d).replace("torch.", "")
                                                                          for d in dtypes))
    for name, t in extra:
        if t.dtype != q.dtype:
            raise ValueError("%s: dtype %s; expected q's, %s (the extra inputs follow q, k, v's precision)"
                             % (name, str(t.dtype).replace("torch.", ""), str(q.dtype).replace("torch.", "")))


def _warn_inexact(arrays):
    import numpy
    names = [name for name, a in arrays if not numpy.array_equal(a, a.astype(numpy.float32))]
    if names:
        _warnings.warn("attnbench.autograd: float64 %s not exact in float32: the fp64 definition reads the values "
                       "rounded to float32 (finite differences need inputs and steps exact in float32)"
                       % ", ".join(names), RuntimeWarning, stacklevel=4)


def _fp64_options(options):
    if options.get("dtype", "fp32") != "fp32":
        raise ValueError("dtype=%r: the float64 path is the fp64 definition on float32 values; a storage dtype "
                         "applies to float32 tensors only" % options["dtype"])
    return {key: value for key, value in options.items() if key not in _KERNEL_ONLY}


def _function_class():
    global _function
    if _function is not None:
        return _function
    import torch

    class Attention(torch.autograd.Function):
        __doc__ = _DOC

        @staticmethod
        def forward(ctx, q, k, v, g, beta, initial_state, sink_logits, variant, options):
            given = [(name, t) for name, t in zip(_EXTRA, (g, beta, initial_state, sink_logits)) if t is not None]
            _check_tensors(torch, q, k, v, given)
            arrays = [t.detach().numpy() for t in (q, k, v)]
            extra = {name: t.detach().numpy() for name, t in given}
            ctx.variant, ctx.options, ctx.given = variant, dict(options), [name for name, _ in given]
            ctx.fp64 = q.dtype == torch.float64
            ctx.out = ctx.state = None
            if ctx.fp64:
                _warn_inexact(list(zip("qkv", arrays)) + list(extra.items()))
                out = _attnbench.reference(*arrays, variant=variant, **_fp64_options(options), **extra)
                if isinstance(out, tuple):
                    out = out[0]
            elif any(ctx.needs_input_grad[:7]):
                out, state = _attnbench.forward(variant, *arrays, save_state=True, **options, **extra)
                ctx.out, ctx.state = out, (state if state.size else None)
            else:
                out = _attnbench.forward(variant, *arrays, **options, **extra)
            ctx.save_for_backward(q, k, v, *(t for _, t in given))
            return torch.from_numpy(out)

        @staticmethod
        def backward(ctx, d_out):
            saved = ctx.saved_tensors
            arrays = [t.detach().numpy() for t in saved[:3]]
            extra = {name: t.detach().numpy() for name, t in zip(ctx.given, saved[3:])}
            d = d_out.detach().numpy()
            if ctx.fp64:
                _warn_inexact([("dO", d)])
                grads = _attnbench.reference_backward(ctx.variant, *arrays, d, **_fp64_options(ctx.options),
                                                      **extra)
            else:
                grads = _attnbench.backward(ctx.variant, *arrays, d, ctx.out, ctx.state, **ctx.options, **extra)
            grads = [torch.from_numpy(x) for x in grads]
            # backward() gives the extra inputs' gradients after dv, in _EXTRA's order, each given one.
            by_name = dict(zip(ctx.given, grads[3:]))
            return (*grads[:3], *(by_name.get(name) for name in _EXTRA), None, None)

    Attention.__module__ = "attnbench.autograd"
    Attention.__qualname__ = "Attention"
    _function = Attention
    return _function


def __getattr__(name):
    if name == "Attention":
        return _function_class()
    raise AttributeError("module 'attnbench.autograd' has no attribute %r" % name)


def attention_function(variant, q, k, v, *, g=None, beta=None, initial_state=None, sink_logits=None, **options):
    """attention_function(variant, q, k, v, *, causal=False, causal_lower_right=False, mask=None,
                   key_padding=None, scale=None, dropout=0.0, seed=0, params=None, threads=None, isa=None,
                   dtype="fp32", alibi=False, alibi_slopes=None, softcap=None, g=None, beta=None,
                   initial_state=None, sink_logits=None) -> torch.Tensor

    O = attention(q, k, v) of a registered variant as a differentiable torch operation (the
    torch.autograd.Function attnbench.autograd.Attention): torch CPU tensors q [batch, heads, seq_q,
    head_dim], k and v [batch, kv_heads, seq_kv, head_dim], all float32 or all float64; the options are
    forward()'s (masks and slopes as arrays or tensors; they get no gradient). g, beta, initial_state (a
    recurrence's gate, beta and starting state) and sink_logits are tensors of q's dtype, differentiable too:
    backward gives dg, dbeta, d_initial_state and d_sink_logits (backward()'s, or reference_backward()'s in
    float64).

    float32: the variant's fp32 kernels, the training forward then attnbench.backward() with the O and state
    it kept (the gradients are backward()'s bit for bit). float64: the variant's fp64 definition,
    reference(..., variant=variant) and reference_backward(), the very definition the fp32 kernels are tested
    against, computed in double on the float32 values of the inputs (threads, isa do not apply; dtype must
    be "fp32"). So torch.autograd.gradcheck in float64 holds the definition's gradient against finite
    differences, given inputs and eps exact in float32 (multiples of 2^-6, eps=2**-10)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError("attention_function() got unexpected keyword argument(s) %s; it takes %s"
                        % (", ".join(unknown), ", ".join(_OPTIONS + _EXTRA)))
    return _function_class().apply(q, k, v, g, beta, initial_state, sink_logits, variant, options)
)PY";

// Creates attnbench.autograd from kAutogradSource (its `_attnbench` is the module `m` itself), registers it
// in sys.modules (so `import attnbench.autograd` works) and exposes attention_function on `m` too.
inline void add_autograd_submodule(pybind11::module_& m) {
  namespace py = pybind11;
  py::module_ sub = py::reinterpret_borrow<py::module_>(
      py::module_::import("types").attr("ModuleType")("attnbench.autograd"));
  py::dict ns = sub.attr("__dict__");
  ns["_attnbench"] = m;
  py::exec(kAutogradSource, ns);
  m.attr("autograd") = sub;
  m.attr("attention_function") = sub.attr("attention_function");
  py::module_::import("sys").attr("modules")["attnbench.autograd"] = sub;
}

}  // namespace attn::python
