"""Walk each library's model tree: find its layers, account for every array, read, write.

A `Walker` per implementation finds the layers of a native model by their kind (`kind_of`), at
any depth, named by their path with list items as ``blocks.0`` in every library. Every
parameter and statistic is accounted for: it belongs to a layer of a registered kind, or it is a
bare array of the model's own modules (a "parameter", e.g. a class token), or the walk fails
with a `ConversionError` naming it (a library layer without a kind, an unknown collection).
Layers of a composite kind are not looked into.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from canonical.errors import ConversionError
from canonical.kinds import KINDS, Arrays, Layer, LayerKind, generation, kind_of
from canonical.paths import join, key_name, path_name
from canonical.torch_arrays import numpy_to_torch, torch_to_numpy

if TYPE_CHECKING:  # Flax is imported by the walkers of its models only
    import flax.linen as nn
    from flax import nnx

LIBRARIES = ("equinox", "flax", "torch", "jax")  # whose own classes need a kind to convert
PARAMETER = "parameter"


CONTAINERS = ("Sequential", "List", "ModuleList", "ModuleDict", "Dict", "Module", "Object")


def _library_class(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] in LIBRARIES


def _library_layer(obj: Any, impl: str) -> bool:
    """A library's layer (not a container) that no kind covers: an unregistered composite."""
    return (_library_class(obj) and type(obj).__name__ not in CONTAINERS
            and kind_of(obj, impl) is None)


def _outermost_layer(path: tuple, module_at: Callable[[tuple], Any], impl: str) -> tuple | None:
    """The outermost library layer without a kind on `path` (its owner included), if any."""
    for i in range(1, len(path) + 1):
        try:
            m = module_at(path[:i])
        except (KeyError, AttributeError, IndexError, TypeError):
            continue
        if _library_layer(m, impl):
            return path[:i]
    return None


def _unconverted(path: tuple, name: str, owner: Any, module_at: Callable[[tuple], Any],
                 impl: str, problems: list[str]) -> None:
    """Name an array no kind converts, or once the library layer (e.g. attention) holding it."""
    outer = _outermost_layer(path, module_at, impl)
    if outer is None or outer == path:
        problems.append(f"{name!r} of {_class_name(owner)}")
        return
    _composite(outer, module_at, problems)


def _composite(path: tuple, module_at: Callable[[tuple], Any], problems: list[str]) -> None:
    entry = f"{'.'.join(map(str, path))!r}: {_class_name(module_at(path))} (no kind covers it)"
    if entry not in problems:
        problems.append(entry)


def _outside_composites(layers: list[Layer], module_at: Callable[[tuple], Any], impl: str,
                        problems: list[str]) -> list[Layer]:
    """`layers` less those inside a library layer no kind covers (e.g. attention made of
    linear layers), which is named in `problems` once instead."""
    out = []
    for layer in layers:
        outer = next((layer.path[:i] for i in range(1, len(layer.path))
                      if _library_layer(module_at(layer.path[:i]), impl)), None)
        if outer is None:
            out.append(layer)
        else:
            _composite(outer, module_at, problems)
    return out


def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def get(obj: Any, parts: Iterable[Any]) -> Any:
    """Follow attribute names, sequence indices and dict keys from `obj`."""
    for p in parts:
        if isinstance(obj, dict):
            obj = obj[p]
        elif isinstance(p, int) or (isinstance(p, str) and p.isdigit() and not hasattr(obj, p)):
            obj = obj[int(p)]
        else:
            obj = getattr(obj, p)
    return obj


def _under(path: tuple[Any, ...], prefixes: Iterable[tuple[Any, ...]]) -> bool:
    return any(path[:len(p)] == p for p in prefixes)


def _refuse(impl: str, problems: list[str]) -> None:
    if problems:
        raise ConversionError(
            f"{impl} model holds {len(problems)} array(s) that no layer kind converts (register "
            "a kind with canonical.register_kind, or a class with canonical.register_class):"
            "\n  - " + "\n  - ".join(problems))


def _kind_layer(module: Any, impl: str, name: str, path: tuple) -> Layer | None:
    kind = kind_of(module, impl)
    if kind is None:
        return None
    if kind.check is not None:
        kind.check(module, impl, name)
    facts = tuple(sorted(kind.facts(module, impl).items())) if kind.facts is not None else ()
    return Layer(name, kind.name, tuple(path), facts=facts)


def with_flatten(layers: list[Layer], native: dict[str, Arrays],
                 flatten_shape: tuple[int, ...] | None) -> list[Layer]:
    """Mark the first linear layer whose input size is prod(flatten_shape) as fed by a flatten
    of that (C, *spatial) map (a structural fact of the architecture, not a layer name)."""
    if flatten_shape is None:
        return layers
    size = int(np.prod(flatten_shape))
    for i, layer in enumerate(layers):
        if layer.kind != "linear":
            continue
        a = native[layer.name]
        fan_in = a["kernel"].shape[0] if "kernel" in a else a["weight"].shape[1]
        if fan_in == size:
            return [*layers[:i], dataclasses.replace(layer, flatten_shape=tuple(flatten_shape)),
                    *layers[i + 1:]]
    raise ConversionError(f"the architecture flattens a {tuple(flatten_shape)} map into a linear "
                          f"layer, but no linear layer has {size} inputs")


def _zeros(a: Any) -> Any:
    return jnp.zeros(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a


class Walker:
    """Interface: one subclass per implementation."""

    impl: ClassVar[str]
    family: ClassVar[str]  # the parameter layout (`canonical.layouts`)
    needs_example: ClassVar[bool] = False  # `layers` traces a call on an example input
    ordered: ClassVar[bool] = True  # `layers` come in definition order (not sorted by name)
    ordered_flat_trees: ClassVar[bool] = False  # a flat {key: array} tree keeps that order too

    @property
    def layer_classes(self) -> str:
        """The implementation whose native classes the layer kinds list for this walker's
        layers (its own; a flavour of another library reuses that one's)."""
        return self.impl

    def layers(self, model: Any, *, example: Any = None) -> list[Layer]:
        """Every layer, in model order; raises ConversionError for arrays nothing converts."""
        raise NotImplementedError

    def read(self, model: Any, layers: list[Layer]) -> dict[str, Arrays]:
        """Each layer's native arrays, by layer name."""
        raise NotImplementedError

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        """A model: `skeleton` with every layer's arrays replaced."""
        raise NotImplementedError

    def abstract(self, skeleton: Any, fn: Callable[[Any], Any]) -> Any:
        """`fn(model)` evaluated for shapes only, on a skeleton of abstract arrays."""
        return jax.eval_shape(lambda: fn(jax.tree.map(_zeros, skeleton)))

    def _names(self, kind: LayerKind) -> tuple[str, ...]:
        return kind.native_names(self.family)

    def as_native_array(self, a: Any) -> Any:
        """A canonical array in the form this library's layers hold (JAX arrays by default)."""
        return jnp.asarray(a)

    def _kind_layers(self, modules: Iterable[tuple[tuple, str, Any]]) -> list[Layer]:
        """The layers of a known kind among `(path, name, module)` in model order (parents
        first), not descending into composite layers."""
        out: list[Layer] = []
        for path, name, m in modules:
            if path and not _under(path, [layer.path for layer in out
                                          if KINDS[layer.kind].composite]):
                layer = _kind_layer(m, self.layer_classes, name, path)
                if layer is not None:
                    out.append(layer)
        return out


# --------------------------------------------------------------------------- Equinox
class EqxWalker(Walker):
    """Equinox: `model` or `(model, state)`; statistics live in the `eqx.nn.State`."""

    impl = "eqx"
    family = "eqx"

    @staticmethod
    def split(obj: Any) -> tuple[Any, Any]:
        return obj if isinstance(obj, tuple) else (obj, None)

    def layers(self, obj: Any, *, example: Any = None) -> list[Layer]:
        model, _ = self.split(obj)
        is_layer = lambda m: kind_of(m, self.layer_classes) is not None
        flat, _ = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_layer)
        out, problems = [], []
        for path, leaf in flat:
            name = path_name(path)
            layer = _kind_layer(leaf, self.layer_classes, name, tuple(key_name(k) for k in path))
            if layer is not None:
                out.append(layer)
            elif eqx.is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct):
                owner = get(model, [key_name(k) for k in path[:-1]])
                if _library_class(owner):
                    _unconverted(tuple(key_name(k) for k in path[:-1]), name, owner,
                                 lambda p: get(model, p), self.layer_classes, problems)
                else:
                    out.append(Layer(name, PARAMETER, tuple(key_name(k) for k in path)))
        out = _outside_composites(out, lambda p: get(model, p), self.layer_classes, problems)
        _refuse(self.impl, problems)
        return out

    def read(self, obj: Any, layers: list[Layer]) -> dict[str, Arrays]:
        model, state = self.split(obj)
        out = {}
        for layer in layers:
            m, kind = get(model, layer.path), KINDS[layer.kind]
            if layer.kind == PARAMETER:
                out[layer.name] = {"": m}
                continue
            arrays = {n: get(m, n.split(".")) for n in self._names(kind) if n not in kind.stats}
            arrays = {n: a for n, a in arrays.items() if a is not None}
            if kind.stats:
                if state is None:
                    raise ConversionError(f"Equinox model has {layer.kind} {layer.name!r} with "
                                          "statistics: pass (model, state)")
                arrays.update(zip(kind.stats, state.get(m.state_index), strict=True))
            out[layer.name] = arrays
        return out

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        model, state = self.split(skeleton)
        where, values, stat_where, stat_values = [], [], [], []
        for layer in layers:
            kind, a = KINDS[layer.kind], arrays[layer.name]
            for n, v in a.items():
                if n in kind.stats:
                    continue
                parts = (*layer.path, *n.split(".")) if n else layer.path
                where.append(parts)
                values.append(v)
            if kind.stats:  # statistics become the StateIndex's initial value (any dtype)
                stat_where.append((*layer.path, "state_index", "init"))
                stat_values.append(tuple(a[s] for s in kind.stats))
        model = eqx.tree_at(lambda m: [get(m, p) for p in where], model, values)
        if stat_where:
            model = eqx.tree_at(lambda m: [get(m, p) for p in stat_where], model, stat_values,
                                is_leaf=lambda x: x is None)
        if state is None:
            return model
        # As eqx.nn.make_with_state does: collect the state, then drop it from the model.
        return eqx.nn.delete_init_state(model), eqx.nn.State(model)


# --------------------------------------------------------------------------- Flax Linen
def list_item_name(owner: Any, part: str) -> str:
    """Linen names the items of a list attribute `blocks_0` (of a nested list `stages_0_1`):
    `blocks.0` (`stages.0.1`) as in the other libraries, when `owner` has such a list."""
    pieces = part.split("_")
    for i in range(len(pieces) - 1, 0, -1):
        if not pieces[i].isdigit():
            break
        attr = "_".join(pieces[:i])
        if owner is not None and isinstance(getattr(owner, attr, None), list | tuple):
            return ".".join((attr, *pieces[i:]))
    return part


def _has_path(tree: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            return False
        tree = tree[key]
    return True


def in_order(tree: Mapping[str, Any], paths: list[tuple[str, ...]]) -> dict[str, Any]:
    """`tree` rebuilt as nested dicts whose keys are inserted in the order of `paths`."""
    out: dict[str, Any] = {}
    for path in paths:
        node, src = out, tree
        for key in path[:-1]:
            node, src = node.setdefault(key, {}), src[key]
        node[path[-1]] = src[path[-1]]
    return out


def leaf_paths(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()
                ) -> Iterator[tuple[str, ...]]:
    """The key paths of nested mappings' leaves in insertion order (creation order for Linen
    variables; `jax.tree_util` sorts the keys)."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from leaf_paths(value, (*prefix, key))
        else:
            yield (*prefix, key)


def _linen_position(found: dict[tuple, tuple], path: tuple) -> tuple[int, ...]:
    """Where `path` was defined: per part, its rank among the children its owner registered
    (in `setup` order, or creation order for compact modules); unknown parts last."""
    out = []
    for i, part in enumerate(path):
        owner = found.get(tuple(path[:i]), ("", None))[1]
        children = list(getattr(getattr(owner, "_state", None), "children", None) or ())
        out.append(children.index(part) if part in children else len(children))
    return tuple(out)


def _walk_key(obj: Any, example: Any) -> Any:
    """What a Linen walk depends on: the module, the variables' structure, shapes and dtypes,
    the input's shape and dtype and the registered kinds; None when the module is unhashable."""
    module, variables = obj
    leaves, tree = jax.tree.flatten(variables)
    shape = lambda a: (tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", type(a))))
    key = (module, tree, tuple(map(shape, leaves)), None if example is None else shape(example),
           generation())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _accepts_train(module: nn.Module) -> bool:
    return "train" in inspect.signature(type(module).__call__).parameters


class LinenWalker(Walker):
    """Linen: `(module, variables)`; parameters in `params`, statistics in `batch_stats`.

    Linen builds its layers lazily, so the walk traces one call on `example` (an abstract
    input in the module's layout) and records every module called, in call order. Linen names
    the items of a list attribute `blocks_0`; they are named `blocks.0` as in the other
    libraries (`stages.0.1` for nested lists).
    """

    impl = "linen"
    family = "flax"
    needs_example = True
    STATS = "batch_stats"
    MEMO = 256  # walks remembered (`layers`): a walk traces the whole model

    def __init__(self) -> None:
        self._walks: collections.OrderedDict[Any, tuple[Layer, ...]] = (
            collections.OrderedDict())

    def _modules(self, module: nn.Module, variables: Any, example: Any) -> dict[tuple, tuple]:
        """(native path) -> (canonical name, module), in call order."""
        if example is None:
            raise ConversionError(f"cannot trace Linen module {type(module).__name__}: it has no "
                                  "zoo config giving its input shape")
        found: dict[tuple, tuple] = {}

        def record(next_fun, args, kwargs, context):
            m = context.module
            path = tuple(m.path)
            if path not in found:
                parent = found.get(path[:-1], ("", None))
                part = list_item_name(parent[1], path[-1]) if path else ""
                found[path] = (join(parent[0], part), m)
            return next_fun(*args, **kwargs)

        import flax.linen as nn

        kwargs = {"train": False} if _accepts_train(module) else {}
        with nn.intercept_methods(record):
            jax.eval_shape(lambda v, x: module.apply(v, x, **kwargs), variables, example)
        return found

    def layers(self, obj: Any, *, example: Any = None) -> list[Layer]:
        """The layers of `(module, variables)`, traced on `example`; a walk of the same module
        (equal, hashable) with variables and input of the same structure, shapes and dtypes is
        remembered rather than traced again."""
        key = _walk_key(obj, example)
        if key is not None and key in self._walks:
            self._walks.move_to_end(key)
            return list(self._walks[key])
        out = self._walk(*obj, example)
        if key is not None:
            self._walks[key] = tuple(out)
            if len(self._walks) > self.MEMO:
                self._walks.popitem(last=False)
        return out

    def _walk(self, module: nn.Module, variables: Any, example: Any) -> list[Layer]:
        found = self._modules(module, variables, example)
        out = self._kind_layers((path, name, m) for path, (name, m) in found.items())
        claimed = [layer.path for layer in out]
        problems = []
        for collection, *rest in leaf_paths(variables):
            path = tuple(rest)
            if collection in ("params", self.STATS) and _under(path[:-1], claimed):
                continue
            owner = found.get(path[:-1], ("", None))
            if collection == "params" and owner[1] is not None and not _library_class(owner[1]):
                out.append(Layer(join(owner[0], path[-1]), PARAMETER, path))
            else:
                _unconverted(path[:-1], f"{collection}/{'/'.join(path)}", owner[1],
                             lambda p: found[p][1], self.layer_classes, problems)
        out = _outside_composites(out, lambda p: found[p][1], self.layer_classes, problems)
        _refuse(self.impl, problems)
        # Definition order, as PyTorch's state_dict lists its modules: each part of a path at
        # its rank among its owner's children (`setup`'s assignment order; a compact module's
        # creation order, i.e. call order). A module that calls its layers in another order
        # than it defines them (a Llama layer: `input_layernorm` called first, defined after
        # `self_attn` and `mlp`) keeps its definition order. Bare parameters take their place
        # among their owner's children as the layers do.
        return sorted(out, key=lambda layer: _linen_position(found, tuple(layer.path)))

    def read(self, obj: Any, layers: list[Layer]) -> dict[str, Arrays]:
        _, variables = obj
        out = {}
        for layer in layers:
            kind = KINDS[layer.kind]
            if layer.kind == PARAMETER:
                out[layer.name] = {"": get(variables["params"], layer.path)}
                continue
            arrays = {}
            for n in self._names(kind):
                tree = variables.get(self.STATS if n in kind.stats else "params", {})
                try:
                    arrays[n] = get(tree, (*layer.path, *n.split(".")))
                except (KeyError, TypeError):
                    continue
            out[layer.name] = arrays
        return out

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        module, _ = skeleton
        variables: dict[str, dict] = {}
        for layer in layers:
            kind = KINDS[layer.kind]
            for n, v in arrays[layer.name].items():
                collection = self.STATS if n in kind.stats else "params"
                *parents, leaf = (*layer.path, *n.split(".")) if n else layer.path
                node = variables.setdefault(collection, {})
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = v
        order = [p for p in leaf_paths(skeleton[1]) if _has_path(variables, p)]
        order += [p for p in leaf_paths(variables) if p not in set(order)]
        return module, in_order(variables, order)  # the skeleton's (creation) order first


# --------------------------------------------------------------------------- Flax NNX
def _value(variable: nnx.Variable) -> Any:
    """A variable's array (abstract ones included: indexing needs a concrete array)."""
    return variable.get_value() if hasattr(variable, "get_value") else variable.value


def _definition_position(model: Any, path: tuple) -> tuple[int, ...]:
    """Where `path` was defined: per part, the item's index or the attribute's rank in the order
    its owner first set its attributes. NNX sorts attributes by name (`iter_modules`, and `vars`
    after a split and merge); the first-set order survives in each object's `_pytree__nodes`."""
    out, obj = [], model
    for part in path:
        if isinstance(part, int):
            out.append(part)
        else:
            names = list(getattr(obj, "_pytree__nodes", None) or vars(obj))
            out.append(names.index(part) if part in names else len(names))
        obj = get(obj, [part])
    return tuple(out)


class NNXWalker(Walker):
    """NNX: the module itself; `nnx.Param` and `nnx.BatchStat` variables are its arrays."""

    impl = "nnx"
    family = "flax"

    def layers(self, model: Any, *, example: Any = None) -> list[Layer]:
        from flax import nnx

        modules = dict(nnx.iter_modules(model))
        order = lambda item: _definition_position(model, item[0])  # parents first
        out = self._kind_layers((path, ".".join(map(str, path)), m)
                                for path, m in sorted(modules.items(), key=order))
        claimed = [layer.path for layer in out]
        problems = []
        arrays = nnx.Any(nnx.Param, nnx.BatchStat)
        for path, _ in sorted(nnx.to_flat_state(nnx.state(model, arrays)),
                              key=lambda item: _definition_position(model, item[0])):
            if _under(path[:-1], claimed):
                continue
            owner = modules.get(path[:-1])
            name = ".".join(map(str, path))
            if owner is not None and not _library_class(owner):
                out.append(Layer(name, PARAMETER, path))
            else:
                _unconverted(path[:-1], name, owner, lambda p: modules[p], self.layer_classes,
                             problems)
        out = _outside_composites(out, lambda p: modules[p], self.layer_classes, problems)
        _refuse(self.impl, problems)
        # Bare parameters take their place in definition order among the layers of known kinds.
        return sorted(out, key=lambda layer: _definition_position(model, tuple(layer.path)))

    def read(self, model: Any, layers: list[Layer]) -> dict[str, Arrays]:
        out = {}
        for layer in layers:
            m, kind = get(model, layer.path), KINDS[layer.kind]
            if layer.kind == PARAMETER:
                out[layer.name] = {"": _value(m)}
                continue
            variables = {n: get(m, n.split(".")) for n in self._names(kind)}
            out[layer.name] = {n: _value(v) for n, v in variables.items() if v is not None}
        return out

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        for layer in layers:
            m = get(skeleton, layer.path)
            for n, v in arrays[layer.name].items():
                (get(m, n.split(".")) if n else m).set_value(v)
        return skeleton

    def abstract(self, skeleton: Any, fn: Callable[[Any], Any]) -> Any:
        from flax import nnx

        graphdef, state = nnx.split(skeleton)
        return jax.eval_shape(lambda: fn(nnx.merge(graphdef, jax.tree.map(_zeros, state))))


# --------------------------------------------------------------------------- PyTorch
class TorchWalker(Walker):
    """PyTorch: the `nn.Module`; its `state_dict` already is the canonical layout."""

    impl = "torch"
    family = "torch"
    ordered_flat_trees = True  # a state_dict

    def as_native_array(self, a: Any) -> Any:
        return a  # numpy: `write` turns the state into tensors itself

    def layers(self, model: Any, *, example: Any = None) -> list[Layer]:
        modules = dict(model.named_modules())
        out = self._kind_layers((tuple(name.split(".")) if name else (), name, m)
                                for name, m in modules.items())
        claimed = [layer.path for layer in out]
        problems = []
        for key in model.state_dict():
            path = tuple(key.split("."))
            if _under(path[:-1], claimed):
                continue
            owner = modules[".".join(path[:-1])]
            if _library_class(owner):
                _unconverted(path[:-1], key, owner, lambda p: modules[".".join(p)],
                             self.layer_classes, problems)
            else:
                out.append(Layer(key, PARAMETER, path))
        out = _outside_composites(out, lambda p: modules[".".join(p)], self.layer_classes,
                                  problems)
        _refuse(self.impl, problems)
        return out

    def read(self, model: Any, layers: list[Layer]) -> dict[str, Arrays]:
        state = model.state_dict()
        out: dict[str, Arrays] = {layer.name: {} for layer in layers}
        for layer in layers:
            if layer.kind == PARAMETER:
                out[layer.name] = {"": torch_to_numpy(state[layer.name])}
        names = {layer.name for layer in layers if layer.kind != PARAMETER}
        for key, value in state.items():  # the longest layer name owns a key (composites)
            parts = key.split(".")
            owner = next((".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)
                          if ".".join(parts[:i]) in names), None)
            if owner is not None:
                out[owner][key[len(owner) + 1:]] = torch_to_numpy(value)
        return out

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        state = {join(name, k): numpy_to_torch(v) for name, a in arrays.items()
                 for k, v in a.items()}
        buffers = {join(layer.name, b) for layer in layers for b in KINDS[layer.kind].buffers}
        weights = [v.dtype for k, v in state.items() if v.is_floating_point()
                   and k not in buffers]
        model = skeleton.to(weights[0]) if weights else skeleton
        model.load_state_dict(state, strict=True)
        for key, value in state.items():  # statistics may stay float32 under bf16 weights
            prefix, _, name = key.rpartition(".")
            owner = model.get_submodule(prefix)
            if value.dtype != getattr(owner, name).dtype and name in owner._buffers:
                owner.register_buffer(name, value)
        return model

    def abstract(self, skeleton: Any, fn: Callable[[Any], Any]) -> Any:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype),
                            fn(skeleton))


WALKERS: dict[str, Walker] = {w.impl: w for w in (EqxWalker(), LinenWalker(), NNXWalker(),
                                                  TorchWalker())}
