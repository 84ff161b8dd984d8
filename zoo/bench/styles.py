"""Call styles: the ways each library calls a jitted model, forward or as a training step.

Every style of a library runs the same computation (the uniform interface's `apply`, or for the
NNX graph-mode styles the model called directly); they differ only in how a call reaches the
compiled program, which is what the dispatch suite measures. Each style returns a `Prepared`
built outside the timed region. Styles marked "donates" donate the parameters, optimizer state
and BatchNorm state of a training step; the idiomatic ones are written as their documentation
writes them, without donation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import flax
import jax
import jax.numpy as jnp
from flax import nnx

from zoo.bench.subjects import LEARNING_RATE, Subject, torch_device, torch_sync
from zoo.bench.timing import Prepared
from zoo.libraries import library
from zoo.runtime.training import pure_step

StyleFn = Callable[[Subject, str], Prepared]


# --------------------------------------------------------------------------- registry
# Every call style by name, each declaring the library it serves (`offered`): how the benchmark
# calls a library is the benchmark's to know, not the library's (`zoo.libraries`).
FUNCTIONS: dict[str, StyleFn] = {}
EVERY_JAX = "every JAX library"  # `offered(EVERY_JAX)`: a style of every `Library.is_jax`


@dataclass(frozen=True)
class Offer:
    style: str
    by: str  # a library's name, or EVERY_JAX
    default: bool  # the library's fastest, what `--call default` runs
    idiomatic: bool  # what the library's own documentation shows


OFFERS: list[Offer] = []


def offered(style: str, by: str, *, default: bool = False,
            idiomatic: bool = False) -> Callable[[StyleFn], StyleFn]:
    """Register a call style `style` of library `by` (or of EVERY_JAX library)."""
    def register(fn: StyleFn) -> StyleFn:
        FUNCTIONS[style] = fn
        OFFERS.append(Offer(style, by, default, idiomatic))
        return fn
    return register


@dataclass(frozen=True)
class Benched:
    """How the benchmark calls library `impl`: its styles (its own, then those of every JAX
    library), its default and its idiomatic one."""

    styles: tuple[str, ...]
    default: str
    idiomatic: str


def benched(impl: str) -> Benched:
    """The call styles of `impl`: those offered by it, else by the library whose classes it
    builds (a flavour is benchmarked as what it is a flavour of)."""
    lib = library(impl)
    owner = lib.name if any(o.by == lib.name for o in OFFERS) else lib.classes_of
    mine = [o for o in OFFERS if o.by == owner] + [o for o in OFFERS
                                                   if o.by == EVERY_JAX and lib.is_jax]
    default = next((o.style for o in mine if o.default), None)
    if default is None:
        raise ValueError(f"impl={impl!r} has no default benchmark call style: declare its "
                         "styles with zoo.bench.styles.offered")
    return Benched(tuple(o.style for o in mine), default,
                   next((o.style for o in mine if o.idiomatic and o.by == owner), default))


def _copy_tree(tree: Any) -> Any:
    """Fresh buffers for a style that donates (never the subject's own arrays)."""
    return jax.tree.map(lambda a: jnp.array(a, copy=True) if isinstance(a, jax.Array) else a,
                        tree)


def _functional_train(subject: Subject, static: Any, params: Any, state: Any,
                      donate: bool) -> Prepared:
    """`jax.jit` of the zoo's pure step (`zoo.runtime.training.pure_step`) over (params, opt_state,
    state) pytrees, threaded by a closure."""
    tx = subject.optimizer()
    jitted = jax.jit(pure_step(subject.api, static, tx, subject.loss_fn),
                     donate_argnums=(0, 1, 2) if donate else ())
    params = _copy_tree(params)
    carry = [params, tx.init(params), _copy_tree(state)]
    x, target, key = subject.x, subject.target, subject.task.key

    def call():
        carry[0], carry[1], carry[2], loss = jitted(*carry, x, target, key)
        return loss

    return Prepared(call, lower=lambda: jitted.lower(*carry, x, target, key))


# --------------------------------------------------------------------------- zoo.runtime.fast (all
# JAX)
@offered("fast", EVERY_JAX, default=True)
def fast(subject: Subject, mode: str) -> Prepared:
    """`zoo.runtime.fast`: split once, pre-flattened leaves, plain `jax.jit` (the training step
    donates on
    accelerators)."""
    if mode == "forward":
        fwd = subject.fast_forward()
        return Prepared(fwd, (subject.x,), lower=lambda: fwd.lower(subject.x),
                        compile_info=subject._cache.get("info_forward"))
    step = subject.fast_train()
    args = subject.train_args()
    return Prepared(step, args, lower=lambda: step.lower(*args),
                    compile_info=subject._cache.get("info_train"))


@offered("fused", EVERY_JAX)
def fused(subject: Subject, mode: str) -> Prepared:
    """`zoo.runtime.fast` with K steps per call (`--steps-per-call K`): training runs K optimizer
    steps in one `lax.scan` (`train_step(steps_per_call=K)`), forward K batches in one `lax.map`;
    times are per step (call time / K)."""
    k = subject.steps_per_call
    single = subject._cache.get(f"info_{mode}")
    counts = single.flop_counts if single is not None else None  # per step, not per loop
    if mode == "forward":
        fwd = subject.fast_forward()
        run = jax.jit(lambda p, s, xs: jax.lax.map(lambda x: fwd.func(p, s, x), xs))
        args = (*fwd.args, subject.stacked(subject.x, k))
        return Prepared(run, args, lower=lambda: run.lower(*args), steps=k,
                        step_flop_counts=counts)
    step = subject.fast_train(k)
    args = subject.train_args(k)
    return Prepared(step, args, lower=lambda: step.lower(*args), steps=k,
                    step_flop_counts=counts)


# --------------------------------------------------------------------------- Equinox
def _eqx_split(native: Any) -> tuple[Any, Any]:
    return native if isinstance(native, tuple) else (native, None)


@offered("filter_jit", "eqx", idiomatic=True)
def eqx_filter_jit(subject: Subject, mode: str) -> Prepared:
    """Idiomatic Equinox: `eqx.filter_jit` on the whole model at every call."""
    api = subject.api
    model, state = _eqx_split(subject.native)
    x = subject.x
    if mode == "forward":
        @eqx.filter_jit
        def forward(model, state, x):
            static, params, _ = api.split(model)
            return api.apply(static, params, state, x)[0]

        args = (model, state, x)
        return Prepared(forward, args, lower=lambda: forward.lower(*args))

    tx, loss_fn = subject.optimizer(), subject.loss_fn
    target, key = subject.target, subject.task.key

    @eqx.filter_jit
    def step(model, state, opt_state, x, target, key):
        def objective(model):
            static, params, _ = api.split(model)
            y, new_state = api.apply(static, params, state, x, train=True, key=key)
            return loss_fn(y, target), new_state

        (loss, new_state), grads = eqx.filter_value_and_grad(objective, has_aux=True)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), new_state, opt_state, loss

    carry = [model, state, tx.init(eqx.filter(model, eqx.is_inexact_array))]

    def call():
        carry[0], carry[1], carry[2], loss = step(*carry, x, target, key)
        return loss

    return Prepared(call, lower=lambda: step.lower(*carry, x, target, key))


@offered("partition", "eqx")
def eqx_partition(subject: Subject, mode: str) -> Prepared:
    """`eqx.partition` once, then `jax.jit(params, state, x)` with the static part closed over
    (training step donates)."""
    static, params, state = subject.api.split(subject.native)
    return _split_jit(subject, mode, static, params, state)


def _split_jit(subject: Subject, mode: str, static: Any, params: Any, state: Any) -> Prepared:
    api = subject.api
    if mode == "forward":
        forward = jax.jit(lambda params, state, x: api.apply(static, params, state, x)[0])
        args = (params, state, subject.x)
        return Prepared(forward, args, lower=lambda: forward.lower(*args))
    return _functional_train(subject, static, params, state, donate=True)


# --------------------------------------------------------------------------- Flax Linen
@offered("jit", "linen", idiomatic=True)
def linen_jit(subject: Subject, mode: str) -> Prepared:
    """Idiomatic Linen: `jax.jit(module.apply)(variables, x)`; training: `jax.jit(train_step)`
    over (params, batch_stats, opt_state) as the Flax examples write it (no donation)."""
    module, variables = subject.native
    if mode == "forward":
        forward = jax.jit(module.apply)
        args = (variables, subject.x)
        return Prepared(forward, args, lower=lambda: forward.lower(*args))
    static, params, state = subject.api.split(subject.native)
    return _functional_train(subject, static, params, state, donate=False)


# --------------------------------------------------------------------------- Flax NNX
def _nnx_update(optimizer: Any, model: Any, grads: Any) -> None:
    """`Optimizer.update(model, grads)` (flax >= 0.11) or `update(grads)` (older)."""
    if "model" in inspect.signature(optimizer.update).parameters:
        optimizer.update(model, grads)
    else:
        optimizer.update(grads)


def _nnx_objects(subject: Subject, mode: str) -> tuple[Any, ...]:
    """A private clone of the model (styles mutate it), in eval or train mode, and for
    training an `nnx.Optimizer`."""
    model = nnx.clone(subject.native)
    if mode == "forward":
        model.eval()
        return (model,)
    model.train()
    return model, nnx.Optimizer(model, subject.optimizer(), wrt=nnx.Param)


def _nnx_forward(model, x):
    return model(x)


def _nnx_step_fn(subject: Subject) -> Callable[..., Any]:
    loss_fn = subject.loss_fn

    def step(model, optimizer, x, target, key):
        def objective(model):
            y = model(x) if key is None else model(x, rngs=key)
            return loss_fn(y, target)

        loss, grads = nnx.value_and_grad(objective)(model)
        _nnx_update(optimizer, model, grads)
        return loss

    return step


@offered("nnx_jit", "nnx", idiomatic=True)
def nnx_jit(subject: Subject, mode: str) -> Prepared:
    """Idiomatic NNX: `nnx.jit(f)(model, ...)` (graph traversal at every call); training with
    `nnx.Optimizer` and `nnx.value_and_grad`, as the Flax documentation writes it."""
    objs = _nnx_objects(subject, mode)
    if mode == "forward":
        f = nnx.jit(_nnx_forward)
        args = (*objs, subject.x)
    else:
        f = nnx.jit(_nnx_step_fn(subject))
        args = (*objs, subject.x, subject.target, subject.task.key)
    return Prepared(f, args, lower=(lambda: f.lower(*args)) if hasattr(f, "lower") else None)


@offered("jit_tree", "nnx")
def nnx_jit_tree(subject: Subject, mode: str) -> Prepared:
    """`nnx.jit(f, graph=False)`: tree mode (the model is a pytree, no graph traversal)."""
    objs = _nnx_objects(subject, mode)
    if mode == "forward":
        f = nnx.jit(_nnx_forward, graph=False)
        args = (*objs, subject.x)
    else:
        f = nnx.jit(_nnx_step_fn(subject), graph=False)
        args = (*objs, subject.x, subject.target, subject.task.key)
    return Prepared(f, args, lower=(lambda: f.lower(*args)) if hasattr(f, "lower") else None)


@offered("flaxlib", "nnx")
def nnx_flaxlib(subject: Subject, mode: str) -> Prepared:
    """`nnx.jit(f)` with `flax_use_flaxlib` (graph traversal in C++, needs `flaxlib`); the flag
    is set around each call only, so that the other styles of a run keep Python traversal."""
    prepared = nnx_jit(subject, mode)
    inner = prepared.fn

    def call(*args: Any) -> Any:
        flax.config.update("flax_use_flaxlib", True)
        try:
            return inner(*args)
        finally:
            flax.config.update("flax_use_flaxlib", False)

    prepared.fn = call
    return prepared


@offered("cached_partial", "nnx")
def nnx_cached_partial(subject: Subject, mode: str) -> Prepared:
    """`nnx.cached_partial(nnx.jit(f), model[, optimizer])`: the graph traversal is cached."""
    objs = _nnx_objects(subject, mode)
    if mode == "forward":
        f = nnx.cached_partial(nnx.jit(_nnx_forward), *objs)
        return Prepared(f, (subject.x,))
    f = nnx.cached_partial(nnx.jit(_nnx_step_fn(subject)), *objs)
    return Prepared(f, (subject.x, subject.target, subject.task.key))


@offered("jit_partial", "nnx")
def nnx_jit_partial(subject: Subject, mode: str) -> Prepared:
    """`nnx.jit_partial(f, model[, optimizer], graph=False)`: pre-flattened tree mode."""
    objs = _nnx_objects(subject, mode)
    if mode == "forward":
        f = nnx.jit_partial(_nnx_forward, *objs, graph=False)
        args = (subject.x,)
    else:
        f = nnx.jit_partial(_nnx_step_fn(subject), *objs, graph=False)
        args = (subject.x, subject.target, subject.task.key)
    return Prepared(f, args, lower=(lambda: f.lower(*args)) if hasattr(f, "lower") else None)


@offered("split", "nnx")
def nnx_split(subject: Subject, mode: str) -> Prepared:
    """`nnx.split` once, then `jax.jit(params, state, x)` with the graphdef closed over
    (training step donates)."""
    static, params, state = subject.api.split(subject.native)
    return _split_jit(subject, mode, static, params, state)


# --------------------------------------------------------------------------- PyTorch
def _torch(subject: Subject, mode: str, compiled: bool) -> Prepared:
    import torch

    model = subject.torch_model()
    x, target = subject.x, subject.target
    block = (lambda out: torch_sync()) if torch_device().type == "cuda" else (lambda out: None)
    if mode == "forward":
        model.eval()
        run = torch.compile(model) if compiled else model

        def forward():
            with torch.no_grad():
                return run(x)

        return Prepared(forward, block=block)
    model.train()
    run = torch.compile(model) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = subject.torch_loss(run(x), target)
        loss.backward()
        opt.step()
        return loss

    return Prepared(step, block=block)


@offered("eager", "torch", default=True, idiomatic=True)
def torch_eager(subject: Subject, mode: str) -> Prepared:
    """PyTorch eager (`torch.no_grad()` for forward; Adam step for training)."""
    return _torch(subject, mode, compiled=False)


@offered("compile", "torch")
def torch_compile(subject: Subject, mode: str) -> Prepared:
    """`torch.compile(model)` (only with --torch-compile; compile time = first call)."""
    return _torch(subject, mode, compiled=True)


def styles(impl: str) -> dict[str, StyleFn]:
    """The call styles of library `impl`, by name."""
    return {name: FUNCTIONS[name] for name in benched(impl).styles}


def default_style(impl: str) -> str:
    return benched(impl).default


def idiomatic_style(impl: str) -> str:
    return benched(impl).idiomatic


def _nnx_has(attr: str) -> str | None:
    return None if hasattr(nnx, attr) else f"flax {flax.__version__} has no nnx.{attr}"


def _nnx_jit_graph() -> str | None:
    if "graph" in inspect.signature(nnx.jit).parameters:
        return None
    return f"flax {flax.__version__}: nnx.jit has no graph= argument (tree mode)"


def _flaxlib() -> str | None:
    try:
        import flaxlib  # noqa: F401
    except ImportError:
        return "flaxlib is not installed (flax_use_flaxlib needs it: pip install flaxlib)"
    if not hasattr(flax.config, "flax_use_flaxlib"):
        return f"flax {flax.__version__} has no flax_use_flaxlib"
    return None


# What an optional style needs from the installed versions: None when available, else why not.
REQUIRES: dict[str, Callable[[], str | None]] = {
    "cached_partial": lambda: _nnx_has("cached_partial"),
    "jit_partial": lambda: _nnx_has("jit_partial"),
    "jit_tree": _nnx_jit_graph,
    "flaxlib": _flaxlib,
}


def unavailable(impl: str, style: str) -> str | None:
    """Why this installation cannot run `style` of `impl` (None when it can)."""
    need = REQUIRES.get(style)
    return need() if need is not None else None


def available_styles(impl: str, *, torch_compile: bool = False, fused: bool = False) -> list[str]:
    """The styles this installation offers for `impl` (NNX partials and tree mode need a recent
    Flax, flaxlib its package); `fused` and torch `compile` only when asked for."""
    asked = {"fused": fused, "compile": torch_compile}
    return [name for name in benched(impl).styles
            if asked.get(name, True) and unavailable(impl, name) is None]


def skipped_styles(impls: tuple[str, ...] | list[str]) -> list[dict[str, str]]:
    """The optional styles this installation lacks, with the reason (recorded in every run)."""
    return [{"impl": impl, "call": style, "reason": reason} for impl in impls
            for style in benched(impl).styles if (reason := unavailable(impl, style)) is not None]


def describe(impl: str, style: str) -> str:
    """First line of the style's docstring (for tables and --help)."""
    doc = inspect.getdoc(styles(impl)[style]) or ""
    return " ".join(doc.split("\n\n")[0].split())
