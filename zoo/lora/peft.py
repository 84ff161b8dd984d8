"""peft's adapter folder, both ways: `adapter_config.json` and `adapter_model.safetensors`,
written as peft 0.21 writes them (every field of its `LoraConfig`, the keys
`base_model.model.<layer>.lora_A.weight` / `lora_B.weight`, metadata `format: pt`), so that
`peft.PeftModel.from_pretrained(base, folder)` loads them with no missing or unexpected key; and
read back from a folder peft wrote. peft itself is not needed for either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from zoo.lora.spec import Adapter, LoraSpec

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
PEFT_VERSION = "0.21.2"  # the version whose files these are (requirements/constraints.txt)

# peft 0.21's `LoraConfig` fields at their defaults, as `save_pretrained` writes them.
DEFAULTS: dict[str, Any] = {
    "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None,
    "auto_mapping": None, "base_model_name_or_path": None, "bias": "none",
    "corda_config": None, "ensure_weight_tying": False, "eva_config": None,
    "exclude_modules": None, "fan_in_fan_out": False, "inference_mode": True,
    "init_lora_weights": True, "kasa_config": None, "layer_replication": None,
    "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": 8,
    "lora_bias": False, "lora_dropout": 0.0, "lora_ga_config": None, "megatron_config": None,
    "megatron_core": "megatron.core", "modules_to_save": None, "monteclora_config": None,
    "peft_type": "LORA", "peft_version": PEFT_VERSION, "qalora_group_size": 16, "r": 8,
    "rank_pattern": {}, "revision": None, "target_modules": None, "target_parameters": None,
    "task_type": None, "trainable_token_indices": None, "use_bdlora": None, "use_dora": False,
    "use_qalora": False, "use_rslora": False, "velora_config": None,
}
# Options of a peft adapter this reader cannot express: refused, named.
UNSUPPORTED = {"use_dora": False, "bias": "none", "lora_bias": False, "modules_to_save": None,
               "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
               "target_parameters": None, "trainable_token_indices": None,
               "layer_replication": None}


def write(adapter: Any, folder: Any, base_model_name_or_path: str | None = None) -> None:
    """Write `adapter` (`zoo.lora.Adapter`) to `folder` as peft does; each file appears whole
    or not at all."""
    from safetensors.numpy import save_file

    spec = adapter.spec
    alpha = int(spec.alpha) if float(spec.alpha).is_integer() else spec.alpha
    config = {**DEFAULTS, "base_model_name_or_path": base_model_name_or_path,
              "fan_in_fan_out": adapter.fan_in_fan_out, "lora_alpha": alpha,
              "lora_dropout": spec.dropout, "r": spec.rank,
              "target_modules": sorted(spec.targets), "use_rslora": spec.use_rslora}
    tensors = {}
    for name, (a, b) in adapter.factors.items():
        tensors[f"{PREFIX}{name}.lora_A.weight"] = np.ascontiguousarray(a)
        tensors[f"{PREFIX}{name}.lora_B.weight"] = np.ascontiguousarray(b)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        save_file(tensors, os.path.join(tmp, WEIGHTS), metadata={"format": "pt"})
        Path(tmp, CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name in (WEIGHTS, CONFIG):
            os.replace(os.path.join(tmp, name), folder / name)


def read(folder: Any) -> Any:
    """The `zoo.lora.Adapter` of a peft LoRA folder; a ValueError in one line names a missing
    file, an option this reader cannot express, or a key that is not a LoRA factor."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name}: no such file (a peft adapter folder holds "
                             f"{CONFIG} and {WEIGHTS})")
    config = json.loads((folder / CONFIG).read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{folder / CONFIG}: peft_type {config.get('peft_type')!r}, not LORA")
    for key, plain in UNSUPPORTED.items():
        if config.get(key, plain) not in (plain, None, {}, [], False, "none"):
            raise ValueError(f"{folder / CONFIG}: {key}={config[key]!r} is not supported")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not targets:
        raise ValueError(f"{folder / CONFIG}: target_modules must be a list of module names, "
                         f"got {targets!r}")
    spec = LoraSpec(int(config["r"]), config["lora_alpha"], tuple(sorted(targets)),
                    float(config.get("lora_dropout", 0.0)), bool(config.get("use_rslora")))
    factors: dict[str, dict[str, np.ndarray]] = {}
    for key, value in load_file(folder / WEIGHTS).items():
        name, sep, which = key.removeprefix(PREFIX).rpartition(".lora_")
        if not key.startswith(PREFIX) or not sep or which not in ("A.weight", "B.weight"):
            raise ValueError(f"{folder / WEIGHTS}: {key!r} is not a LoRA factor "
                             f"({PREFIX}<layer>.lora_A.weight / lora_B.weight)")
        factors.setdefault(name, {})[which[0]] = value
    half = sorted(n for n, f in factors.items() if len(f) != 2)
    if half:
        raise ValueError(f"{folder / WEIGHTS}: {half[0]} has only one of lora_A / lora_B")
    return Adapter(spec, {n: (f["A"], f["B"]) for n, f in factors.items()},
                   bool(config.get("fan_in_fan_out")))
