"""CLIP and SigLIP in Flax Linen: the text tower on the shared body
(`zoo.models.decoder.linen`, at `text_model`), the zoo's ViT (at `vision_model`), the
projections and the logit scale (and bias) with transformers' names; batched, images
channels-last."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.models.clip.config import ClipConfig
from zoo.models.common import dtype_of
from zoo.models.decoder.linen import Decoder
from zoo.models.vit.linen import ViT


def normalize(x: jax.Array) -> jax.Array:
    """`x` over its L2 norm along the last axis, as transformers' `_get_vector_norm`."""
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))


class Clip(nn.Module):
    """transformers' `CLIPModel` (or `SiglipModel`, `config.model_type`)."""

    config: ClipConfig
    param_dtype: str = "float32"

    def setup(self) -> None:
        c, f, dt = self.config, self.config.family, dtype_of(self.param_dtype)
        constant = lambda value: lambda key, shape, dtype: jnp.full(shape, value, dtype)
        self.logit_scale = self.param("logit_scale", constant(c.logit_scale_init_value),
                                      f.scale_shape, dt)
        self.logit_bias = (self.param("logit_bias", constant(c.logit_bias_init_value), (1,),
                                      dt) if f.logit_bias else None)
        self.text_model = Decoder(c.decoder, self.param_dtype)
        self.vision_model = ViT(c.vision, self.param_dtype)
        dense = lambda: nn.Dense(c.projection_dim, use_bias=False, param_dtype=dt)
        self.visual_projection = dense() if f.projections else None
        self.text_projection = dense() if f.projections else None

    def get_image_features(self, pixel_values: jax.Array, *, train: bool = False
                           ) -> jax.Array:
        """The images' features `(N, projection_dim)` (not normalised)."""
        x = self.vision_model(pixel_values, train=train)
        return x if self.visual_projection is None else self.visual_projection(x)

    def get_text_features(self, input_ids: jax.Array, *,
                          attention_mask: jax.Array | None = None, train: bool = False
                          ) -> jax.Array:
        """The texts' features `(N, projection_dim)` (not normalised) of token ids `(N, L)`."""
        h = self.text_model(input_ids, attention_mask, None, train)
        x = self.text_model.pool(h, input_ids)
        return x if self.text_projection is None else self.text_projection(x)

    def scale_logits(self, cosines: jax.Array) -> jax.Array:
        """Cosine similarities as logits: times `exp(logit_scale)` (plus the logit bias)."""
        out = cosines * jnp.exp(self.logit_scale).reshape(())  # SigLIP's (1,): a scalar
        return out if self.logit_bias is None else out + self.logit_bias.reshape(())

    def logits(self, pixel_values: jax.Array, input_ids: jax.Array,
               attention_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """transformers' `(logits_per_image (N, M), logits_per_text (M, N))` of N images
        and M texts."""
        image = normalize(self.get_image_features(pixel_values))
        text = normalize(self.get_text_features(input_ids, attention_mask=attention_mask))
        per_text = self.scale_logits(text @ image.T)
        return per_text.T, per_text

    def __call__(self, pixel_values: jax.Array, *, input_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, train: bool = False) -> jax.Array:
        """Each image-text pair's logit `(N, 1)` (images `(N, H, W, C)`, token ids `(N, L)`;
        none: the config's `placeholder_ids`)."""
        self.config.check_input(pixel_values.shape, channels_last=True)
        if input_ids is None:
            ids = jnp.asarray(self.config.placeholder_ids())
            input_ids = jnp.broadcast_to(ids, (pixel_values.shape[0], ids.shape[0]))
        image = normalize(self.get_image_features(pixel_values, train=train))
        text = normalize(self.get_text_features(input_ids, attention_mask=attention_mask,
                                                train=train))
        return self.scale_logits(jnp.sum(image * text, axis=-1, keepdims=True))
