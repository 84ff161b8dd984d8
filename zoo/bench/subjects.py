"""What a benchmark runs: one native model per implementation, one task (data, target, loss).

Everything here happens outside any timed region: building the models from one canonical state,
drawing the inputs (non-degenerate random data, fixed seed) and converting them to each library's
layout.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

import zoo
from canonical.torch_arrays import numpy_to_torch
from zoo.bench.spec import NativeModels, SubjectConfig, bench_spec
from zoo.configs import Overrides
from zoo.libraries import library
from zoo.runtime import fast, sharding
from zoo.runtime.training import IGNORE, LOSSES, TOKEN_LOSSES, targets

LEARNING_RATE = 1e-3


def torch_device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass(eq=False)
class Task:
    """Canonical data for every implementation: `x` (N, C, *spatial; token ids (N, L) for a
    language model), `target` (class labels for classifiers, token labels for a language model,
    else an array shaped like the canonical output), the loss kind, for models with dropout a
    dropout key, and the config (whose `CHANNELS` says how layouts change)."""

    x: jax.Array
    target: jax.Array
    loss: str  # "cross_entropy", "mse" or "next_token" (zoo.runtime.training.LOSSES)
    key: jax.Array | None = None
    config: Any = None

    @property
    def batch(self) -> int:
        return int(self.x.shape[0])

    @property
    def dtype(self) -> str:
        return jnp.dtype(self.x.dtype).name


JAX_LOSSES = LOSSES


def make_task(config: SubjectConfig, batch: int, dtype: str = "float32", seed: int = 0) -> Task:
    """Random inputs (seed `seed`: normal values in `dtype`, a language model's token ids;
    `Config.sample_input`), the architecture's targets (seed `seed + 1`; a language model's
    are its input's token labels)."""
    sample = getattr(config, "sample_input", None)
    if sample is not None:
        x = sample(jax.random.key(seed), batch, dtype)
    else:  # a bench-only subject
        x = jax.random.normal(jax.random.key(seed), (batch, *config.input_shape),
                              jnp.float32).astype(dtype)
    target = targets(config, batch, jax.random.key(seed + 1), dtype, x=x)
    key = jax.random.key(seed + 2) if getattr(config, "dropout", 0.0) > 0 else None
    return Task(*jax.block_until_ready((x, target)), loss=config.LOSS, key=key, config=config)


def build_config(arch: str, overrides: Overrides, method: str) -> SubjectConfig:
    """The config of subject `arch` with `overrides` and the conv-transpose `method` (for a zoo
    architecture: `zoo.make_config`, a `conv_method` field getting `method`)."""
    return bench_spec(arch).subjects.config(arch, overrides, method)


def build_models(config: SubjectConfig, impls: tuple[str, ...], seed: int = 0,
                 dtype: str = "float32") -> NativeModels:
    """One native model per implementation, all holding the same canonical weights.

    For zoo architectures this is `zoo.create(config, impl, seed=seed, dtype=dtype)`, i.e.
    `from_canonical(canonical_init(config, seed, dtype), config, impl)`, with the canonical
    state drawn once and shared instead of once per library.
    """
    return bench_spec(config.arch).subjects.models(config, impls, seed, dtype)


@dataclass(eq=False)
class Subject:
    """One implementation under test: its native model and the task in its own layout.

    `name` labels it in reports and errors (normally the impl). Models are never mutated by the
    benchmark: styles that train in place (NNX, PyTorch) work on copies. With a `mesh` (the
    native model's arrays already placed on it, `zoo.runtime.sharding.shard`), the data are split
    over its "data" axis and the training step runs on it (`zoo.runtime.fast.train_step(mesh=)`).
    """

    impl: str
    native: Any
    task: Task
    name: str = ""
    steps_per_call: int = 1  # K of the "fused" call style
    mesh: Mesh | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.impl

    @property
    def is_torch(self) -> bool:
        return not library(self.impl).is_jax

    @property
    def api(self) -> Any:
        return zoo.interface(self.impl)

    def _memo(self, key: str, make: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # ---- data in the library's layout (converted once, outside timing)
    @property
    def x(self) -> Any:
        return self._memo("x", lambda: self._native_array(self.task.x))

    @property
    def target(self) -> Any:
        if self.task.loss in ("cross_entropy", *TOKEN_LOSSES):  # labels: no layout
            return self._memo("t", lambda: self._native_array(self.task.target, layout=False))
        return self._memo("t", lambda: self._native_array(self.task.target))

    def _native_array(self, a: jax.Array, layout: bool = True) -> Any:
        if self.is_torch:
            return numpy_to_torch(np.asarray(a)).to(torch_device())
        a = self.api.to_native(a, self.task.config) if layout else a
        if self.mesh is not None:
            a = jax.device_put(a, sharding.batch_sharding(self.mesh))
        return jax.block_until_ready(a)

    # ---- losses and optimizers (the same in every library)
    @property
    def loss_fn(self) -> Any:
        return JAX_LOSSES[self.task.loss]

    def torch_loss(self, y: Any, target: Any) -> Any:
        import torch.nn.functional as F

        if self.task.loss == "cross_entropy":
            return F.cross_entropy(y.float(), target.long())
        if self.task.loss == "next_token":  # zoo.runtime.training.next_token: shifted, -100 ignored
            return F.cross_entropy(y[:, :-1].flatten(0, 1).float(),
                                   target[:, 1:].flatten().long(), ignore_index=IGNORE)
        if self.task.loss == "masked_token":  # zoo.runtime.training.masked_token: -100 ignored
            return F.cross_entropy(y.flatten(0, 1).float(), target.flatten().long(),
                                   ignore_index=IGNORE)
        return F.mse_loss(y.float(), target.float())

    @staticmethod
    def optimizer() -> optax.GradientTransformation:
        return optax.adam(LEARNING_RATE)

    def torch_model(self) -> Any:
        """A fresh copy of the PyTorch model on the benchmark device."""
        return copy.deepcopy(self.native).to(torch_device())

    # ---- outputs in canonical layout (fairness check)
    def to_canonical(self, y: Any) -> np.ndarray:
        if self.is_torch:
            return y.detach().float().cpu().numpy()
        return np.asarray(self.api.to_canonical(y, self.task.config).astype(jnp.float32))

    def parameter_count(self) -> int:
        if self.is_torch:
            return sum(p.numel() for p in self.native.parameters())
        _, params, _ = self.api.split(self.native)
        return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))

    # ---- the zoo's fast path, shared by the fairness check and the "fast" call style
    def fast_forward(self) -> Any:
        return self._memo("fast_forward", lambda: fast.forward(self.native, self.impl))

    def fast_train(self, steps: int = 1) -> Any:
        """`zoo.runtime.fast.train_step` (`steps` > 1: K fused steps per call)."""
        name = "fast_train" if steps == 1 else f"fast_train{steps}"
        return self._memo(name, lambda: fast.train_step(
            self.native, self.impl, self.optimizer(), self.loss_fn, steps_per_call=steps,
            mesh=self.mesh))

    def held_arrays(self, mode: str) -> dict[str, Any]:
        """The arrays the fast path holds for `mode`: parameters, optimizer state (training) and
        the model's state (BatchNorm statistics)."""
        if mode == "forward":
            fwd = self.fast_forward()
            return {"params": fwd.param_leaves, "state": fwd.state_leaves}
        step = self.fast_train()
        return {"params": step.params, "opt_state": step.opt_state, "state": step.state}

    @staticmethod
    def stacked(a: Any, steps: int) -> Any:
        """`steps` copies of `a` stacked on a new leading axis (the batches of a fused call)."""
        return jax.block_until_ready(jnp.stack([a] * steps))

    def train_args(self, steps: int = 1) -> tuple[Any, ...]:
        """(x, target) or (x, target, key): the arguments of one training step; with `steps` > 1,
        those of a fused call: the same batch (and dropout key, as the single step reuses it)
        stacked `steps` times."""
        args = (self.x, self.target) if self.task.key is None else (
            self.x, self.target, self.task.key)
        return args if steps == 1 else tuple(self.stacked(a, steps) for a in args)
