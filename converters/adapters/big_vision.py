"""The original Flax ViT releases as `.npz` files: google-research/vision_transformer's
(`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1`, `MlpBlock_3`, `LayerNorm_2`,
`Transformer/posembed_input/pos_embedding`, training states under `opt/target/`) and
big_vision's (`MultiHeadDotProductAttention_0`, `MlpBlock_0`, `LayerNorm_1`, `pos_embedding`,
the SigLIP towers' `MAPHead_0`; under `params/`, a two-tower model's image tower under
`params/img/`), layers one key each or stacked on a first axis (scanned:
`Transformer/encoderblock/...`). Keys are the flattened Flax tree joined by `/`, as both
repositories write them (`np.savez`).

Values change as timm's `vision_transformer._load_weights` changes them: Flax kernels
`(in, out)` transposed, the patch kernel `(kh, kw, in, out)` made `(out, in, kh, kw)`, the
attention's per-head kernels `(E, heads, D)` and biases `(heads, D)` flattened into `qkv` (q,
k, v stacked), the output kernel `(heads, D, E)` into `proj`; the attention pool's key and value
into `kv`. LayerNorm's `scale` is `weight`. The inverse needs the number of heads: the layout is
read, not written. A two-tower file's text tower and logit scale and bias are left out.
"""

from __future__ import annotations

from converters.adapters.adapter import (
    CONV_KERNEL,
    FLATTEN,
    HEADS_IN,
    HEADS_OUT,
    TRANSPOSE,
    Adapter,
    Drop,
    Fuse,
    Rename,
)

_BLOCK = "Transformer/encoderblock_{i}/"
_QKV = ("query", "key", "value")


def _norm(flax: str, zoo: str) -> tuple[Rename, ...]:
    return (Rename(f"{flax}/scale", f"{zoo}.weight"), Rename(f"{flax}/bias", f"{zoo}.bias"))


def _dense(flax: str, zoo: str) -> tuple[Rename, ...]:
    return (Rename(f"{flax}/kernel", f"{zoo}.weight", TRANSPOSE),
            Rename(f"{flax}/bias", f"{zoo}.bias"))


def _mlp(flax: str, zoo: str) -> tuple[Rename, ...]:
    return (*_dense(f"{flax}/Dense_0", f"{zoo}.fc1"), *_dense(f"{flax}/Dense_1", f"{zoo}.fc2"))


def _attention_out(flax: str, zoo: str) -> tuple[Rename, ...]:
    return (Rename(f"{flax}/out/kernel", f"{zoo}.weight", HEADS_OUT),
            Rename(f"{flax}/out/bias", f"{zoo}.bias"))


def _block(attention: str, norm2: str, mlp: str) -> tuple[tuple[Rename, ...], tuple[Fuse, ...]]:
    """One naming of the encoder blocks (the repositories number their sub-modules apart)."""
    mha = f"{_BLOCK}{attention}"
    renames = (*_norm(f"{_BLOCK}LayerNorm_0", "blocks.{i}.norm1"),
               *_attention_out(mha, "blocks.{i}.attn.proj"),
               *_norm(f"{_BLOCK}{norm2}", "blocks.{i}.norm2"),
               *_mlp(f"{_BLOCK}{mlp}", "blocks.{i}.mlp"))
    fuses = (Fuse(tuple(f"{mha}/{n}/kernel" for n in _QKV), "blocks.{i}.attn.qkv.weight",
                  "query, key and value", HEADS_IN),
             Fuse(tuple(f"{mha}/{n}/bias" for n in _QKV), "blocks.{i}.attn.qkv.bias",
                  "query, key and value", FLATTEN))
    return renames, fuses


_ORIGINAL = _block("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
_BIG_VISION = _block("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
_MAP = "MAPHead_0/"
_MAP_MHA = _MAP + "MultiHeadDotProductAttention_0"

BIG_VISION_VIT = Adapter(
    name="big-vision-vit",
    description="Flax ViT .npz (google-research/vision_transformer, big_vision)", arch="vit",
    strip=("opt/target/", "params/img/", "params/"),
    unstack=(("Transformer/encoderblock/", _BLOCK),),
    groups=(("embedding/kernel", "patch embedding (embedding/kernel)"),
            ("pos_embedding", "position embedding (pos_embedding)")),
    renames=(
        Rename("embedding/kernel", "patch_embed.proj.weight", CONV_KERNEL),
        Rename("embedding/bias", "patch_embed.proj.bias"),
        Rename("cls", "cls_token"),
        Rename("Transformer/posembed_input/pos_embedding", "pos_embed"),
        Rename("pos_embedding", "pos_embed"),
        *_ORIGINAL[0], *_BIG_VISION[0],
        *_norm("Transformer/encoder_norm", "norm"),
        Rename(_MAP + "probe", "attn_pool.latent"),
        Rename(f"{_MAP_MHA}/query/kernel", "attn_pool.q.weight", HEADS_IN),
        Rename(f"{_MAP_MHA}/query/bias", "attn_pool.q.bias", FLATTEN),
        *_attention_out(_MAP_MHA, "attn_pool.proj"),
        *_norm(_MAP + "LayerNorm_0", "attn_pool.norm"),
        *_mlp(_MAP + "MlpBlock_0", "attn_pool.mlp"),
        *_dense("head", "head")),
    fuses=(*_ORIGINAL[1], *_BIG_VISION[1],
           Fuse((f"{_MAP_MHA}/key/kernel", f"{_MAP_MHA}/value/kernel"), "attn_pool.kv.weight",
                "the attention pool's key and value", HEADS_IN),
           Fuse((f"{_MAP_MHA}/key/bias", f"{_MAP_MHA}/value/bias"), "attn_pool.kv.bias",
                "the attention pool's key and value", FLATTEN)),
    drops=(Drop("txt/{r}", "the text tower of a two-tower (SigLIP) checkpoint"),
           Drop("t", "the logit scale of a two-tower checkpoint"),
           Drop("b", "the logit bias of a two-tower checkpoint")))
