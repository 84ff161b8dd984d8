"""The ViT's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zoo.configs import Axis, Config, ConfigError, positive
from zoo.weights.adaptation import Adapter, AdaptInputConv, ResamplePosEmbed, ResetClassifier

# timm's names of the ViT families the zoo builds (each pinned to timm's keys, shapes and
# parameter count by tests/fixtures/named_timm_vit*.json).
_PLAIN = {  # vit_{size}_patch{16,32}_{224,384}: width, depth, heads
    "tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16)}
_DINOV2 = {"small": (384, 12, 6), "base": (768, 12, 12)}  # + giant, with SwiGLU
_GIANT = {"width": 1536, "depth": 40, "num_heads": 24, "mlp_ratio": 2.66667 * 2,
          "mlp_layer": "swiglu_packed", "act_layer": "silu"}
_DEIT = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}  # width, heads; depth 12
_CLIP = {"base_patch16": (768, 12, 12, 16), "large_patch14": (1024, 24, 16, 14)}
_CLIP_PROJECTION = {"base_patch16": 512, "large_patch14": 768}  # the OpenAI towers' heads


def _width(width: int, ratio: float) -> int:
    """timm's `int(width * mlp_ratio)`, exact for a ratio read as one width over another
    (`intermediate_size / hidden_size` of a `config.json`: 1152 * (4304 / 1152) is
    4303.999...)."""
    return int(width * ratio + 1e-6)


def _named() -> dict[str, dict[str, Any]]:
    named: dict[str, dict[str, Any]] = {
        f"vit_{size}_patch{patch}_{image}": {
            "width": width, "depth": depth, "num_heads": heads, "patch_size": patch,
            "image_size": (image, image)}
        for size, (width, depth, heads) in _PLAIN.items()
        for patch in (16, 32) for image in (224, 384)
        if (size, patch) != ("tiny", 32)}  # the combinations timm has
    # DINOv2 (timm's image size 518, LayerScale 1e-5, no head); the _reg4 ones have 4
    # registers and a position embedding over the patches only.
    dinov2 = {"patch_size": 14, "image_size": (518, 518), "init_values": 1e-5, "num_classes": 0}
    for size, (width, depth, heads) in {**_DINOV2, "giant": (0, 0, 0)}.items():
        sizes = _GIANT if size == "giant" else {"width": width, "depth": depth,
                                                "num_heads": heads}
        named[f"vit_{size}_patch14_dinov2"] = {**dinov2, **sizes}
        named[f"vit_{size}_patch14_reg4_dinov2"] = {**dinov2, **sizes, "reg_tokens": 4,
                                                     "no_embed_class": True}
    # DeiT: the plain ones are timm's ViTs; the distilled ones add a distillation token and head.
    for size, (width, heads) in _DEIT.items():
        deit = {"width": width, "depth": 12, "num_heads": heads}
        named[f"deit_{size}_patch16_224"] = deit
        named[f"deit_{size}_distilled_patch16_224"] = {**deit, "distilled": True}
    named["deit_base_patch16_384"] = {**named["deit_base_patch16_224"], "image_size": (384, 384)}
    named["deit_base_distilled_patch16_384"] = {**named["deit_base_distilled_patch16_224"],
                                                "image_size": (384, 384)}
    # CLIP image towers: pre-norm, LayerNorm epsilon 1e-5; the OpenAI weights' QuickGELU towers
    # (`_quickgelu`) carry the image projection as their head.
    for name, (width, depth, heads, patch) in _CLIP.items():
        clip = {"width": width, "depth": depth, "num_heads": heads, "patch_size": patch,
                "pre_norm": True, "norm_eps": 1e-5}
        named[f"vit_{name}_clip_224"] = clip
        named[f"vit_{name}_clip_quickgelu_224"] = {
            **clip, "act_layer": "quick_gelu", "num_classes": _CLIP_PROJECTION[name]}
    # SigLIP image towers: no class token, attention-pool head (timm's "map"), no classifier.
    siglip = {"class_token": False, "global_pool": "map", "num_classes": 0}
    named["vit_base_patch16_siglip_224"] = {**siglip, "width": 768, "depth": 12, "num_heads": 12}
    named["vit_so400m_patch14_siglip_384"] = {
        **siglip, "width": 1152, "depth": 27, "num_heads": 16, "mlp_ratio": 3.7362,
        "patch_size": 14, "image_size": (384, 384)}
    return named


@dataclass(frozen=True)
class ViTConfig(Config):
    """timm's `VisionTransformer`: patch embedding, prefix tokens, blocks, pooling, head.

    The defaults are timm's `vit_tiny_patch16_224` (224x224, patch 16, width 192, depth 12,
    3 heads, MLP 768, 1000 classes, LayerNorm epsilon 1e-6, biases on qkv, class-token
    pooling). timm's options, with its names and meaning: `global_pool` ("token", "avg" over
    the patch tokens, or "map": timm's `AttentionPoolLatent`, a learned query attending to the
    patch tokens), `fc_norm` (None: timm's default, a LayerNorm after an "avg" pool in place
    of the final `norm`), `class_token`, `reg_tokens` (register tokens after the class token),
    `no_embed_class` (the position embedding covers the patches only), `pre_norm` (`norm_pre`
    before the blocks; the patch embedding then has no bias), `qkv_bias`, `init_values`
    (LayerScale `ls1`/`ls2.gamma`, None: none), `num_classes` (0: no head, the pooled
    features are the output), `act_layer` (the MLPs' activation: "gelu" exact, "gelu_tanh",
    "quick_gelu" of OpenAI's CLIP, "silu"), `mlp_layer` ("mlp", or "swiglu_packed": timm's
    `SwiGLUPacked`, one `fc1` to twice the hidden width, `act(first half) * second half`),
    `dynamic_img_size` (any patch-divisible input size: the position embedding is resampled
    to the input's patch grid at every call, bicubic with antialiasing as timm's),
    `drop_path_rate` (stochastic depth in training, rising linearly to this rate over the
    blocks, as timm's), and DeiT's `distilled` (timm's `VisionTransformerDistilled`: a
    distillation token after the class token and a second head `head_dist`; the output is
    the mean of the two heads).
    """

    arch: ClassVar[str] = "vit"
    REFERENCES: ClassVar[dict[str, str]] = {
        "timm's VisionTransformer": "tests/test_vit.py",
        "timm's DeiT, DINOv2, CLIP and SigLIP towers": "tests/test_vit_towers.py",
        "timm's keys, shapes and parameter counts": "tests/test_named_models.py",
        "transformers' ViT": "tests/test_hf_vit.py",
        "transformers' DINOv2, CLIP and SigLIP towers": "tests/test_hf_towers.py",
        "big_vision's and vision_transformer's `.npz` files": "tests/test_big_vision_npz.py",
    }
    TINY: ClassVar[dict[str, Any]] = {"image_size": (8, 8), "patch_size": 4, "in_channels": 3,
                                      "width": 8, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0,
                                      "num_classes": 5}
    # timm's options on: average pooling with fc_norm, no class token, register tokens, the
    # position embedding on patches only, norm_pre, no qkv bias, LayerScale; the published
    # towers' options: an attention-pool head, SwiGLU gated by QuickGELU, any input size
    # (DeiT's distillation token and the other activations: tests/test_vit_towers.py).
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {
        "options": {"global_pool": "avg", "class_token": False, "reg_tokens": 2,
                    "no_embed_class": True, "pre_norm": True, "qkv_bias": False,
                    "init_values": 0.1},
        "towers": {"global_pool": "map", "class_token": False, "reg_tokens": 1,
                   "mlp_layer": "swiglu_packed", "act_layer": "quick_gelu",
                   "dynamic_img_size": True, "init_values": 0.1}}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = _named()
    # timm's pretrained adaptations: a new head for another num_classes (DeiT's second head
    # too), the position embedding resampled for another image_size, the patch projection for
    # another in_channels.
    ADAPTERS: ClassVar[tuple[Adapter, ...]] = (
        ResetClassifier("head"), ResetClassifier("head_dist"), ResamplePosEmbed("pos_embed"),
        AdaptInputConv("patch_embed.proj.weight"))
    HEADLESS: ClassVar[dict[str, Any]] = {"num_classes": 0}  # timm's headless model
    LOSS: ClassVar[str] = "cross_entropy"
    TIMM_ARGS: ClassVar[dict[str, str | None]] = {"embed_dim": "width"}
    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_channels: int = 3
    width: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    norm_eps: float = 1e-6  # timm's (PyTorch's LayerNorm default is 1e-5, Flax's 1e-6)
    global_pool: Literal["token", "avg", "map"] = "token"
    fc_norm: bool | None = None
    class_token: bool = True
    reg_tokens: int = 0
    no_embed_class: bool = False
    pre_norm: bool = False
    qkv_bias: bool = True
    init_values: float | None = None
    act_layer: Literal["gelu", "gelu_tanh", "quick_gelu", "silu"] = "gelu"
    mlp_layer: Literal["mlp", "swiglu_packed"] = "mlp"
    dynamic_img_size: bool = False
    drop_path_rate: float = 0.0
    distilled: bool = False

    def validate(self) -> None:
        if len(self.image_size) != 2:
            raise ConfigError(f"vit.image_size must have 2 entries, found {self.image_size}")
        positive("vit sizes", (*self.image_size, self.patch_size, self.in_channels, self.width,
                               self.depth, self.num_heads))
        if self.num_classes < 0:
            raise ConfigError(f"vit.num_classes must be >= 0 (0: no head), found "
                              f"{self.num_classes}")
        if any(s < self.patch_size for s in self.image_size):
            raise ConfigError(f"vit.image_size {self.image_size} is smaller than one patch "
                              f"({self.patch_size})")
        if self.width % self.num_heads:
            raise ConfigError(f"vit.width {self.width} must be a multiple of num_heads "
                              f"{self.num_heads}")
        if self.mlp_ratio <= 0 or self.mlp_hidden < 1:
            raise ConfigError(f"vit.mlp_ratio must give a positive hidden size, found "
                              f"{self.mlp_ratio}")
        if self.mlp_layer == "swiglu_packed" and self.mlp_hidden % 2:
            raise ConfigError(f"vit.mlp_layer 'swiglu_packed' splits the hidden width in two: "
                              f"width * mlp_ratio = {self.mlp_hidden} must be even")
        if not self.norm_eps > 0:
            raise ConfigError(f"vit.norm_eps must be positive, found {self.norm_eps}")
        if self.fc_norm not in (None, True, False):
            raise ConfigError(f"vit.fc_norm must be true, false or null, found {self.fc_norm!r}")
        if self.init_values is not None and (isinstance(self.init_values, bool) or not
                                             isinstance(self.init_values, int | float)):
            raise ConfigError(f"vit.init_values must be a number or null, found "
                              f"{self.init_values!r}")
        if self.reg_tokens < 0:
            raise ConfigError(f"vit.reg_tokens must be >= 0, found {self.reg_tokens}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ConfigError(f"vit.drop_path_rate must be in [0, 1), found "
                              f"{self.drop_path_rate}")
        if self.global_pool == "token" and not self.class_token:
            raise ConfigError("vit: global_pool='token' needs class_token=True (timm's rule)")
        if self.distilled and (self.global_pool != "token" or self.reg_tokens):
            raise ConfigError("vit: distilled (DeiT) reads the class and distillation tokens: "
                              "global_pool='token' and no reg_tokens (timm's rule)")

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per image side (rows, columns) at `image_size`: the position embedding's
        grid (a remainder of a patch is left out, as timm's convolution does)."""
        h, w = self.image_size
        return (h // self.patch_size, w // self.patch_size)

    def grid_of(self, size: tuple[int, ...]) -> tuple[int, int]:
        """Patches per side of an input of spatial `size` (H, W)."""
        return (int(size[0]) // self.patch_size, int(size[1]) // self.patch_size)

    @property
    def num_prefix_tokens(self) -> int:
        """The class token, DeiT's distillation token and the register tokens (if any), in
        that order before the patches."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def seq_len(self) -> int:
        """Tokens per image at `image_size`: the prefix tokens and the patches."""
        return self.grid[0] * self.grid[1] + self.num_prefix_tokens

    @property
    def embed_len(self) -> int:
        """Rows of the position embedding: the patches, plus the prefix tokens unless
        `no_embed_class`."""
        return self.seq_len - (self.num_prefix_tokens if self.no_embed_class else 0)

    @property
    def pos_prefix(self) -> int:
        """The rows of the position embedding that belong to prefix tokens (not resampled)."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    @property
    def use_fc_norm(self) -> bool:
        """Whether a LayerNorm `fc_norm` follows the pool (and the final `norm` is left out)."""
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden width (`fc1`'s outputs; SwiGLU's gate and value halves)."""
        return _width(self.width, self.mlp_ratio)

    @property
    def mlp_inner(self) -> int:
        """The inputs of `fc2`: the hidden width, or half of it after SwiGLU's gating."""
        return self.mlp_hidden // 2 if self.mlp_layer == "swiglu_packed" else self.mlp_hidden

    @property
    def pool_hidden(self) -> int:
        """The hidden width of the attention pool's MLP (timm's `int(width * mlp_ratio)`)."""
        return _width(self.width, self.mlp_ratio)

    @property
    def num_features(self) -> int:
        """The pooled features' width (the output when `num_classes` is 0)."""
        return self.width

    def drop_path_rates(self) -> tuple[float, ...]:
        """Each block's drop path rate: `linspace(0, drop_path_rate, depth)`, as timm's."""
        n = self.depth
        return tuple(self.drop_path_rate * i / (n - 1) if n > 1 else 0.0 for i in range(n))

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.image_size)

    @property
    def input_axes(self) -> tuple[Axis, ...]:
        """The channels and `image_size`; with `dynamic_img_size`, any height and width that
        are multiples of the patch size (the position embedding follows the input)."""
        if not self.dynamic_img_size:
            return super().input_axes
        p = self.patch_size
        return (Axis("C", size=self.in_channels), Axis("H", minimum=p, multiple=p),
                Axis("W", minimum=p, multiple=p))

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes or self.num_features,)
