"""Hugging Face folders of the language models, both ways, with the command line and no
--arch: transformers' `save_pretrained` folders (sharded safetensors and single files) convert
into each library's format and back into a folder that
`transformers.AutoModelForCausalLM.from_pretrained` loads with no missing, unexpected or
mismatched key, computing the same logits; bfloat16 stays bfloat16 unless --dtype says
otherwise, and the output says which; every field the zoo does not compute is refused in one
line that names it."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

import converters
import zoo
from converters.checkpoints import detect
from tests.converter_cli import cli
from tests.lm_reference import QUICK, VARIANTS, hf_model, padded_batch, relative

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
RELATIVE = 1e-5


def _logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids).long()).logits.float().numpy()


def _saved(tmp_path, name: str, shard: str | None = "20KB", dtype=None):
    """The transformers model of variant `name` saved by `save_pretrained` (sharded unless
    `shard` is None), and that model."""
    model = hf_model(name) if dtype is None else copy.deepcopy(hf_model(name)).to(dtype)
    folder = tmp_path / f"hf-{name}"
    kwargs = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(folder, **kwargs)
    return folder, model


def _loads_strictly(folder):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                     "error_msgs")), info
    return model.eval()


# Each family (each Gemma generation, Phi-3) through one library's format, every format at least
# once (and the canonical layout);
# `--quick` keeps the Llama family's tiny config through Equinox.
ROUND_TRIPS = [pytest.param(*case, marks=pytest.mark.full_only) if case[0] != QUICK else case
               for case in (("gpt2", "nnx"), ("llama-gqa-rope3", "eqx"),
                            ("mistral-window", "linen"), ("qwen2-bias-tied", "torch"),
                            ("qwen3-norm-head-dim", "nnx"), ("gpt2-untied", "canonical"),
                            ("gemma-tied", "linen"), ("gemma2-softcap-window", "eqx"),
                            ("gemma3-qk-norm-local-rope", "torch"),
                            ("phi3-partial-rope-tied", "nnx"), ("mixtral-moe", "nnx"),
                            ("qwen3-moe-dense-layer", "eqx"))]


@pytest.mark.parametrize(("name", "fmt"), ROUND_TRIPS)
def test_sharded_folder_to_a_library_and_back_loads_in_transformers(name, fmt, tmp_path,
                                                                    capsys):
    folder, model = _saved(tmp_path, name)
    assert (folder / "model.safetensors.index.json").is_file()
    assert detect(folder).fmt == "hub"
    native = tmp_path / ("native.pt" if fmt == "torch" else "native")
    code, out, err = cli(capsys, "convert", folder, native, "--to", fmt, "--no-progress")
    assert code == 0, err
    assert "hub folder" in out and "config from" in out and "as stored" in out
    back = tmp_path / "back"
    code, out, err = cli(capsys, "convert", native, back, "--to", "hub", "--shard-size", "30KB",
                         "--no-progress")
    assert code == 0, err
    index = json.loads((back / "model.safetensors.index.json").read_text())
    ties = {t.alias for t in VARIANTS[name].ties}
    assert not ties & set(index["weight_map"])  # a tied tensor is stored once
    ids = padded_batch(VARIANTS[name])[0]
    assert relative(_logits(_loads_strictly(back), ids), _logits(model, ids)) <= RELATIVE
    # Every field of the source config reads back with its value in transformers (rope_theta
    # or rope_parameters, eps, window, biases, ties...: a default may be left unwritten).
    source, written = (transformers.AutoConfig.from_pretrained(f).to_dict() for f in (folder, back))
    bookkeeping = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"}
    changed = {k: (v, written.get(k)) for k, v in source.items()
               if k not in bookkeeping and written.get(k) != v}
    assert not changed, f"config.json fields lost or changed (source, written): {changed}"


@pytest.mark.full_only
def test_single_file_folder_and_a_zoo_model_written_as_a_hub_folder(tmp_path, capsys):
    """`save_pretrained` without shards (`model.safetensors`), read with no --arch; a zoo model
    saved with `converters.save(..., "hub")` loads in transformers."""
    folder, model = _saved(tmp_path, "qwen3-norm-head-dim", shard=None)
    assert (folder / "model.safetensors").is_file()
    ck = converters.load(folder)
    assert ck.config == dataclasses.replace(VARIANTS["qwen3-norm-head-dim"], seq_len=None)
    nnx_model = converters.load(folder, "nnx")
    converters.save(nnx_model, tmp_path / "out", "hub")
    ids = padded_batch(ck.config)[0]
    got = _logits(_loads_strictly(tmp_path / "out"), ids)
    assert relative(got, _logits(model, ids)) <= RELATIVE


@pytest.mark.full_only
def test_bfloat16_stays_bfloat16_unless_dtype_says_otherwise(tmp_path, capsys):
    folder, model = _saved(tmp_path, "llama-gqa-rope3", dtype=torch.bfloat16)
    out_bf16 = tmp_path / "bf16"
    code, out, err = cli(capsys, "convert", folder, out_bf16, "--to", "nnx", "--no-progress")
    assert code == 0, err
    assert "dtype: bfloat16, as stored" in out
    assert converters.load(out_bf16).dtype == np.dtype("bfloat16")
    back = tmp_path / "back"
    code, _, err = cli(capsys, "convert", out_bf16, back, "--to", "hub", "--no-progress")
    assert code == 0, err
    reloaded = _loads_strictly(back)
    assert reloaded.dtype == torch.bfloat16
    ids = padded_batch(VARIANTS["llama-gqa-rope3"])[0]
    np.testing.assert_array_equal(_logits(reloaded, ids), _logits(model, ids))  # bitwise
    out_f32 = tmp_path / "f32"
    code, out, err = cli(capsys, "convert", folder, out_f32, "--to", "eqx", "--dtype",
                         "float32", "--no-progress")
    assert code == 0, err
    assert "dtype: float32, cast by --dtype float32" in out
    assert "cast from bfloat16 to float32" in out
    assert converters.load(out_f32).dtype == np.dtype("float32")


def _folder_with(tmp_path, name: str, **fields):
    """A saved folder of variant `name` whose config.json has `fields` set (None: removed)."""
    folder, _ = _saved(tmp_path, name, shard=None)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(fields)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in raw.items()
                                                    if v is not None}))
    return folder


@pytest.mark.parametrize(("name", "fields", "message"), [
    ("qwen2-bias-tied", {"use_sliding_window": True},
     r"use_sliding_window True is not supported by the zoo's qwen2"),
    ("llama-gqa-rope3", {"num_local_experts": 8, "num_experts_per_tok": 2},
     r"mixture-of-experts fields \(num_local_experts, num_experts_per_tok\)"),
    ("llama-gqa-rope3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     r"rope_scaling type 'yarn' is not supported by the zoo \(supported: 'default', 'llama3'\)"),
    ("llama-gqa-rope3", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True},
     r"scale_attn_by_inverse_layer_idx True is not supported"),
    ("qwen3-norm-head-dim", {"frobnicate": 1}, r"config field\(s\) frobnicate have no "
                                               r"counterpart"),
    ("mistral-window", {"model_type": "falcon"},
     r"model_type 'falcon' is not one the zoo reads; known: vit, gpt2, llama, mistral, qwen2, "
     r"qwen3, gemma, gemma2, gemma3_text, gemma3, phi3, mixtral, qwen3_moe"),
    ("gemma2-softcap-window", {"use_bidirectional_attention": True},
     r"use_bidirectional_attention True is not supported by the zoo's gemma2"),
    ("gemma2-softcap-window", {"hidden_activation": "gelu"},
     r"hidden_activation 'gelu' is not supported by the zoo's gemma2"),
    ("gemma3-qk-norm-local-rope", {"rope_parameters": None,
                                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     r"rope_scaling type 'yarn' is not supported by the zoo's gemma"),
    ("gemma3-qk-norm-local-rope", {"model_type": "gemma3"},
     r"model_type 'gemma3' is Gemma3ForConditionalGeneration, a multimodal checkpoint"),
    ("phi3-gqa-window", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4,
                                          "long_factor": [2.0] * 4},
                         "original_max_position_embeddings": 256},
     r"rope_scaling type 'longrope' \(longrope: short_factor / long_factor switched at "
     r"original_max_position_embeddings"),
    ("phi3-gqa-window", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported by the "
                                                r"zoo's phi3 \(Phi3ForCausalLM\)"),
    ("mixtral-moe", {"router_jitter_noise": 0.1},
     r"router_jitter_noise 0.1 is not supported by the zoo's mixtral"),
    ("qwen3-moe-dense-layer", {"use_sliding_window": True},
     r"use_sliding_window True is not supported by the zoo's qwen3_moe"),
    ("qwen3-moe-dense-layer", {"shared_expert_intermediate_size": 8},
     r"config field\(s\) shared_expert_intermediate_size have no counterpart"),
])
def test_unsupported_fields_are_refused_in_one_line_naming_them(tmp_path, capsys, name, fields,
                                                                message):
    folder = _folder_with(tmp_path, name, **fields)
    code, _, err = cli(capsys, "convert", folder, tmp_path / "out", "--to", "nnx",
                       "--no-progress")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert pytest.importorskip("re").search(message, err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("arch", "fields", "message"), [
    ("llama", {"qk_norm": True},
     "LlamaForCausalLM (model_type 'llama') has no per-head q/k norm (qk_norm)"),
    ("mixtral", {"mlp_only_layers": (0,)},
     "MixtralForCausalLM (model_type 'mixtral') has no dense layers (mlp_only_layers, "
     "decoder_sparse_step)")])
def test_a_config_its_model_type_cannot_express_is_not_written(tmp_path, capsys, arch, fields,
                                                                message):
    import zoo

    config = zoo.tiny_config(arch, **fields)
    converters.save(zoo.create(config, "nnx"), tmp_path / "m", "nnx")
    code, _, err = cli(capsys, "convert", tmp_path / "m", tmp_path / "hub", "--to", "hub")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_rotary_settings_of_both_families_are_read_by_one_rule():
    """`rope_fields`: each supported type's entries required and renamed, others refused."""
    from converters.adapters.hf_lm import rope_fields
    from zoo.configs import ConfigError

    linear = {"default": {}, "linear": {"factor": "rope_factor"}}
    assert rope_fields({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}, "f", "x",
                       linear) == {"rope_type": "linear", "rope_factor": 8.0,
                                   "rope_theta": 1e6}
    assert rope_fields({}, "f", "x", linear) == {"rope_type": "default"}
    for params, message in (({"type": "linear"}, "x of type 'linear' lacks factor"),
                            ({"rope_type": "yarn"}, "x type 'yarn' is not supported by g "
                                                    r"\(supported: 'default', 'linear'\)"),
                            ({"factor": 2.0}, r"x entries \['factor'\] are not supported by g")):
        with pytest.raises(ConfigError, match=message):
            rope_fields(params, "f", "x", linear, "g")


def test_the_llama_reader_takes_both_rotary_spellings():
    """transformers 4's top-level `rope_theta` (what the zoo writes) and transformers 5's
    `rope_parameters` give the same config, a base other than the default included."""
    from converters.adapters import config_readers

    cfg = dataclasses.replace(zoo.tiny_config("llama", rope_type="default", rope_theta=1e6),
                              seq_len=None)
    v4 = config_readers.writer_for(cfg).hub_config(cfg)
    assert v4["rope_theta"] == 1e6 and "rope_parameters" not in v4
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    read = [config_readers.reader_for(raw).config(raw, "config.json") for raw in (v4, v5)]
    assert read[0] == read[1] and read[0].decoder == cfg.decoder  # rotary frequencies included
    assert (read[0].rope_type, read[0].rope_theta) == ("default", 1e6)
