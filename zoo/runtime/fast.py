"""The fastest way to call a zoo model: pre-flattened leaves and a plain `jax.jit`.

    fwd = zoo.runtime.fast.forward(model, "nnx")            # any Equinox / Linen / NNX model
    y = fwd(x)                                      # x in the library's native layout

    step = zoo.runtime.fast.train_step(model, "nnx", optax.adam(1e-3), loss_fn)
    for x, target in batches:
        loss = step(x, target)                      # params, opt_state, BN state donated
    model = step.model()                            # a native model holding the trained weights

    fused = zoo.runtime.fast.train_step(model, "nnx", optax.adam(1e-3), loss_fn, steps_per_call=100)
    losses = fused(xs, targets)                     # xs: 100 stacked batches, one dispatch

Fused multi-step training (`steps_per_call=K`): K optimizer steps over K stacked batches run in
one `jax.lax.scan` per call, so a small model pays the per-call dispatch cost once per K steps.
K fused steps compute what K single steps compute (same parameters, optimizer and BatchNorm
state, losses; tested in tests/test_fast.py). Dropout: pass K stacked keys, the i-th being the key
the i-th single step would get (e.g. `jax.random.split(key, K)`).

Why this is fast (measured in `python -m zoo.bench dispatch`, see
docs/investigations/dispatch.md): the model is split once into its static part (closed over
by the jitted function) and flat lists of arrays.
Each call then hands `jax.jit` a few lists of arrays and nothing else, so its C++ dispatch path does
no Python work per leaf and no graph traversal: the per-call cost is that of a raw `jax.jit` on
pre-flattened arrays (the floor), whatever the library and however many static fields the model
carries. `eqx.filter_jit` and `nnx.jit` instead re-partition or traverse the model at every call.

Both functions work for every model of a JAX library of the zoo ("eqx", "linen", "nnx"): they
use the uniform interface of `zoo.interface` (split / apply / merge), not the architecture.

Training on a CPU under Linux, call `zoo.runtime.malloc.keep_freed_memory()` first (before JAX
starts): XLA:CPU's per-call buffers then stop costing a page fault per 4 KiB. Measured: the ViT
training step (vit-cifar, batch 32) at 1.01-1.03x PyTorch's with it, 1.40x without
(docs/investigations/cpu_training_step.md).
Convolution models on a CPU: `zoo.bench.xla_flags.apply("eigen-conv")` first (or that preset's
flag in `XLA_FLAGS`) gives 2-D convolutions to XLA's own kernels instead of YNNPACK's, which ran
ResNet-18's 64-channel 32x32 layers on one of two cores: ResNet-18-cifar at 1.18-1.20x PyTorch's
time instead of 1.49-1.55x, the CNN's training step at 0.82x instead of 1.09x.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from zoo.libraries import interface, library
from zoo.runtime import sharding
from zoo.runtime.training import pure_step

__all__ = ["Forward", "TrainStep", "forward", "train_step"]


def _steps(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"steps_per_call must be a positive int, got {value!r}")
    return value


def _check_stacked(name: str, tree: Any, steps: int) -> None:
    """Trace-time check (free at call time) that every leaf of `tree` has `steps` rows."""
    for leaf in jax.tree.leaves(tree):
        lead = leaf.shape[0] if leaf.ndim else None
        if lead != steps:
            raise ValueError(f"{name}: steps_per_call={steps} needs a leading axis of {steps} "
                             f"stacked batches, got shape {tuple(leaf.shape)}")


def _copy(leaves: list[Any]) -> list[Any]:
    """Fresh buffers, so that donating them never invalidates the caller's model."""
    return [jnp.array(a, copy=True) for a in leaves]


class Forward(functools.partial):
    """A jitted forward pass with the model's arrays bound as pre-flattened leaves.

    Calling it is calling `jax.jit` on `(param_leaves, state_leaves, x[, key])` directly (this
    class is a `functools.partial`, so no Python frame is added per call). The arrays are those of
    the model when `forward` was called: after training, make a new one from the trained model.

    **Attributes:** `impl`, `train`, `jitted` (the `jax.jit` function), `param_leaves`,
    `state_leaves`. **Methods:** `lower(x, key=None)` for ahead-of-time compilation and cost
    analysis of exactly the program a call runs.
    """

    impl: str
    train: bool

    @property
    def jitted(self) -> Any:
        return self.func

    @property
    def param_leaves(self) -> list[Any]:
        return self.args[0]

    @property
    def state_leaves(self) -> list[Any]:
        return self.args[1]

    def lower(self, x: jax.Array, key: jax.Array | None = None, **inputs: Any) -> Any:
        """`jax.jit(...).lower` with the bound leaves: the same call signature as
        `self(x, key, **inputs)`."""
        args = (*self.args, x) if key is None else (*self.args, x, key)
        return self.func.lower(*args, **inputs)


def forward(model: Any, impl: str, *, train: bool = False) -> Forward:
    """A jitted forward pass of `model` (a native model of `impl`) on native-layout inputs.

    **Arguments:**
    - `model`: what `zoo.create(arch, impl)` returns: Equinox `model` or `(model, state)`,
      Linen `(module, variables)`, NNX `model`. Works for any model the uniform interface
      (`zoo.interface(impl)`) can split, not only the zoo's architectures.
    - `impl`: "eqx", "linen" or "nnx".
    - `train`: False (default) runs inference (BatchNorm running statistics, no dropout).
      True runs the training-mode forward: batch statistics, dropout when a `key` is given.

    **Returns:** `f` with `f(x)` / `f(x, key)` -> `y` when `train` is False, and
    `(y, new_state)` when True (`new_state`: the updated BatchNorm statistics in the library's
    own form, or None). `x` and `y` are in the library's native layout
    (`zoo.interface(impl).to_native` converts canonical `(N, C, *spatial)` inputs). The
    model's other inputs are keywords, batched as `x` (a language model's
    `f(ids, attention_mask=mask, position_ids=pos)`).
    """
    api = interface(impl)
    static, params, state = api.split(model)
    param_leaves, param_tree = jax.tree.flatten(params)
    state_leaves, state_tree = jax.tree.flatten(state)

    def pure(param_leaves: list[Any], state_leaves: list[Any], x: jax.Array,
             key: jax.Array | None = None, **inputs: Any) -> Any:
        y, new_state = api.apply(static, param_tree.unflatten(param_leaves),
                                 state_tree.unflatten(state_leaves), x, train=train, key=key,
                                 **inputs)
        return (y, new_state) if train else y

    fwd = Forward(jax.jit(pure), param_leaves, state_leaves)
    fwd.impl, fwd.train = impl, train
    return fwd


class TrainStep:
    """A jitted training step that owns (copies of) the parameters, optimizer and BN state.

    `step(x, target, key=None)` runs loss, gradients and the optimizer update, replaces the
    held arrays by the new ones and returns the loss (a JAX scalar, not waited for). With
    `steps_per_call=K > 1`, `x`, `target` (and `key`) are K stacked batches (leading axis K),
    the K steps run in one `jax.lax.scan`, and the K losses are returned. The
    previous arrays are donated to the computation, so XLA updates them in place where the
    backend supports donation. The caller's model is never donated: construction copies it.

    **Attributes:** `impl`, `jitted` (the pure `jax.jit` function
    `(param_leaves, opt_leaves, state_leaves, x, target[, key]) ->
    (param_leaves, opt_leaves, state_leaves, loss)`, with arguments 0-2 donated),
    `leaves` (the current `(param_leaves, opt_leaves, state_leaves)`; with a partition, the
    parameters are its trainable part), `frozen_leaves` (the frozen part, passed to every call
    as the keyword `frozen_leaves`), and the properties `params`, `opt_state`, `state` (as
    pytrees). **Methods:** `model()` (a native model with the
    current arrays), `lower(x, target, key=None)`.
    """

    def __init__(self, model: Any, impl: str, optimizer: optax.GradientTransformation,
                 loss_fn: Callable[[jax.Array, Any], jax.Array], *,
                 donate: bool | None = None, opt_state: Any = None,
                 steps_per_call: int = 1, unroll: int | bool = 1,
                 mesh: Mesh | None = None, trainable: Callable[[str], bool] | None = None
                 ) -> None:
        self.steps_per_call = steps = _steps(steps_per_call)
        if donate is None:  # measured: XLA:CPU copies donated parameters (CNN step 1.46x slower)
            donate = jax.default_backend() != "cpu"
        self.donate = donate
        api = interface(impl)
        static, params, state = api.split(model)
        params, frozen = (params, None) if trainable is None else api.partition(
            static, params, trainable)
        if mesh is not None:
            mesh = sharding.auto(mesh)
            params, state = _on_mesh(params, mesh), _on_mesh(state, mesh)
            frozen = _on_mesh(frozen, mesh)
        if opt_state is None:
            opt_state = optimizer.init(params)
        if mesh is not None:
            opt_state = _on_mesh(opt_state, mesh)
        param_leaves, param_tree = jax.tree.flatten(params)
        opt_leaves, opt_tree = jax.tree.flatten(opt_state)
        state_leaves, state_tree = jax.tree.flatten(state)
        frozen_leaves, frozen_tree = jax.tree.flatten(frozen)
        step = pure_step(api, static, optimizer, loss_fn)
        batch = (lambda tree: tree) if mesh is None else functools.partial(
            library(impl).constrain, where=sharding.batch_sharding(mesh, 0 if steps == 1 else 1))

        def pure(param_leaves: list[Any], opt_leaves: list[Any], state_leaves: list[Any],
                 x: jax.Array, target: Any, key: jax.Array | None = None,
                 frozen_leaves: list[Any] = (), **inputs: Any) -> tuple:
            if steps == 1:
                x, target = batch(x), batch(target)
                inputs = {k: batch(v) for k, v in inputs.items()}
            new_params, new_opt, new_state, loss = step(
                param_tree.unflatten(param_leaves), opt_tree.unflatten(opt_leaves),
                state_tree.unflatten(state_leaves), x, target, key,
                frozen=None if frozen is None else frozen_tree.unflatten(frozen_leaves),
                **inputs)
            new_state_leaves, new_state_tree = jax.tree.flatten(new_state)
            if new_state_tree != state_tree:
                raise ValueError(f"{impl} apply changed the state structure: {state_tree} -> "
                                 f"{new_state_tree}")
            return jax.tree.leaves(new_params), jax.tree.leaves(new_opt), new_state_leaves, loss

        def fused(param_leaves: list[Any], opt_leaves: list[Any], state_leaves: list[Any],
                  xs: jax.Array, targets: Any, keys: jax.Array | None = None,
                  frozen_leaves: list[Any] = (), **inputs: Any) -> tuple:
            for name, tree in (("x", xs), ("target", targets), ("key", keys), *inputs.items()):
                _check_stacked(name, tree, steps)
            xs, targets = batch(xs), batch(targets)
            inputs = {k: batch(v) for k, v in inputs.items()}

            def body(carry: tuple, batch: tuple) -> tuple:
                x, target, key, more = batch
                *leaves, loss = pure(*carry, x, target, key, frozen_leaves, **more)
                return tuple(leaves), loss

            carry, losses = jax.lax.scan(body, (param_leaves, opt_leaves, state_leaves),
                                         (xs, targets, keys, inputs), unroll=unroll)
            return (*carry, losses)

        self.impl, self.mesh = impl, mesh
        shardings = None if mesh is None else (
            *([a.sharding for a in leaves] for leaves in (param_leaves, opt_leaves, state_leaves)),
            sharding.replicated(mesh))
        self.jitted = jax.jit(pure if steps == 1 else fused, out_shardings=shardings,
                              donate_argnums=(0, 1, 2) if donate else ())
        self.leaves = (_copy(param_leaves), _copy(opt_leaves), _copy(state_leaves))
        self.frozen_leaves = frozen_leaves  # an argument of every call, never copied or donated
        self._api, self._static, self._frozen_tree = api, static, frozen_tree
        self._trees = (param_tree, opt_tree, state_tree)

    def __call__(self, x: jax.Array, target: Any, key: jax.Array | None = None,
                 **inputs: Any) -> jax.Array:
        args = (*self.leaves, x, target) if key is None else (*self.leaves, x, target, key)
        *leaves, loss = self.jitted(*args, frozen_leaves=self.frozen_leaves, **inputs)
        self.leaves = tuple(leaves)
        return loss

    def lower(self, x: jax.Array, target: Any, key: jax.Array | None = None,
              **inputs: Any) -> Any:
        """`jax.jit(...).lower` with the held arrays: the same signature as a call."""
        args = (*self.leaves, x, target) if key is None else (*self.leaves, x, target, key)
        return self.jitted.lower(*args, frozen_leaves=self.frozen_leaves, **inputs)

    @property
    def params(self) -> Any:
        return self._trees[0].unflatten(self.leaves[0])

    @property
    def opt_state(self) -> Any:
        return self._trees[1].unflatten(self.leaves[1])

    @property
    def state(self) -> Any:
        return self._trees[2].unflatten(self.leaves[2])

    def model(self) -> Any:
        """A native model (same form as the one given) holding the current arrays (copies)."""
        params = self._trees[0].unflatten(_copy(self.leaves[0]))
        if self.frozen_leaves:
            params = self._api.combine(params, self._frozen_tree.unflatten(self.frozen_leaves))
        state = self._trees[2].unflatten(_copy(self.leaves[2]))
        return self._api.merge(self._static, params, state)


def train_step(model: Any, impl: str, optimizer: optax.GradientTransformation,
               loss_fn: Callable[[jax.Array, Any], jax.Array], *,
               donate: bool | None = None, opt_state: Any = None,
               steps_per_call: int = 1, unroll: int | bool = 1,
               mesh: Mesh | None = None,
               trainable: Callable[[str], bool] | None = None) -> TrainStep:
    """A jitted training step for `model` (a native model of `impl`) with buffer donation.

    **Arguments:**
    - `model`, `impl`: as for `forward`.
    - `optimizer`: an optax `GradientTransformation`; its state is initialised here.
    - `loss_fn(y, target) -> scalar`: `y` is the model's training-mode output in the library's
      native layout, `target` whatever you pass to the step.
    - `donate`: donate the held parameters, optimizer state and BN state. Default (None):
      on accelerators, not on CPU, where XLA inserts copies of donated parameters (measured:
      a Linen CNN step 1.46x slower with donation, docs/investigations/dispatch.md).
    - `opt_state`: an optimizer state to resume from (default: `optimizer.init(params)`).
    - `steps_per_call`: K optimizer steps per call (default 1), fused in one `jax.lax.scan`:
      the step then takes K stacked batches `xs` (K, *x.shape), `targets` and, for dropout,
      K stacked keys (one per step, e.g. `jax.random.split(key, K)`), and returns the K losses.
      One dispatch per K steps: for small models, where dispatch dominates, K = 100 runs the
      MLP at batch 1 faster per step (docs/investigations/dispatch.md).
    - `unroll`: `jax.lax.scan`'s `unroll` for the fused steps (default 1: a loop). On XLA:CPU
      a convolutional step inside the loop ran 5.5x slower per step than called alone (CNN,
      batch 64: 300 vs 55 ms); `unroll=True` (the K steps inlined, compile time grows with K)
      brought it back to parity. Dense models are not affected.
    - `mesh`: a `jax.sharding.Mesh` with a "data" axis: the step runs on it, the batch (`x`
      and `target`) split over "data" inside the step by the library's own constraint
      (`Library.constrain`: `eqx.filter_shard` in Equinox, `jax.lax.with_sharding_constraint`
      in Flax), the arrays kept as they lie (`zoo.create(...,
      mesh=mesh, strategy=...)`; arrays not on `mesh` are replicated on it), the optimizer
      state sharded as its parameters. The numbers are those of one device (`zoo.runtime.sharding`).

    **Returns:** a `TrainStep`: `loss = step(x, target)` (or `step(x, target, key)` for dropout)
    updates the held arrays; `step.model()` gives the trained native model. The model's other
    inputs are keywords, batched as `x` (a language model: `step(ids, labels,
    attention_mask=mask)`, with `zoo.runtime.training.next_token` as `loss_fn`; stacked too with
    `steps_per_call`).

    - `trainable`: a partition (`zoo.partition.Partition`, `zoo.lora.TRAINABLE`): only the
      parameters it names are differentiated, updated and held in the optimizer state; the
      others (split off by the library's `Interface.partition`) are an argument of each call,
      never copied, donated or changed.

    The gradients are taken with respect to the interface's `params` (Equinox: inexact arrays,
    Linen: the `params` collection, NNX: `nnx.Param`); BatchNorm statistics follow the training
    forward pass, as in `model.train()` in PyTorch.
    """
    return TrainStep(model, impl, optimizer, loss_fn, donate=donate, opt_state=opt_state,
                     steps_per_call=steps_per_call, unroll=unroll, mesh=mesh,
                     trainable=trainable)


def _on_mesh(tree: Any, mesh: Mesh) -> Any:
    """`tree` with every array on `mesh`: as it lies if it is there already, else replicated
    (an optimizer state initialised from sharded parameters is sharded as they are)."""
    def place(a: Any) -> Any:
        if isinstance(a, jax.Array) and getattr(a.sharding, "mesh", None) == mesh:
            return a
        return jax.device_put(a, sharding.replicated(mesh))

    return jax.tree.map(place, tree)

