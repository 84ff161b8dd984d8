"""CLIP and SigLIP in Flax NNX: the text tower on the shared body (`zoo.models.decoder.nnx`,
at `text_model`), the zoo's ViT (at `vision_model`), the projections and the logit scale (and
bias) with transformers' names; batched, images channels-last."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.models.clip.config import ClipConfig
from zoo.models.common import dtype_of
from zoo.models.decoder.nnx import Decoder, Rngs
from zoo.models.vit.nnx import ViT


def normalize(x: jax.Array) -> jax.Array:
    """`x` over its L2 norm along the last axis, as transformers' `_get_vector_norm`."""
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))


class Clip(nnx.Module):
    """transformers' `CLIPModel` (or `SiglipModel`, `config.model_type`); the modules the
    family has not are not set."""

    def __init__(self, config: ClipConfig, *, rngs: nnx.Rngs, param_dtype: Any = None) -> None:
        c, f, dt, p = config, config.family, dtype_of(param_dtype), config.projection_dim
        self.config = config
        self.logit_scale = nnx.Param(jnp.full(f.scale_shape, c.logit_scale_init_value, dt))
        if f.logit_bias:
            self.logit_bias = nnx.Param(jnp.full((1,), c.logit_bias_init_value, dt))
        self.text_model = Decoder(c.decoder, rngs=rngs, param_dtype=dt)
        self.vision_model = ViT(c.vision, rngs=rngs, param_dtype=dt)
        if f.projections:
            linear = lambda i: nnx.Linear(i, p, use_bias=False, param_dtype=dt, rngs=rngs)
            self.visual_projection = linear(c.vision_hidden_size)
            self.text_projection = linear(c.text_hidden_size)

    def get_image_features(self, pixel_values: jax.Array, *, rngs: Rngs = None) -> jax.Array:
        """The images' features `(N, projection_dim)` (not normalised)."""
        x = self.vision_model(pixel_values, rngs=rngs)
        return self.visual_projection(x) if self.config.family.projections else x

    def get_text_features(self, input_ids: jax.Array, *,
                          attention_mask: jax.Array | None = None, rngs: Rngs = None
                          ) -> jax.Array:
        """The texts' features `(N, projection_dim)` (not normalised) of token ids `(N, L)`."""
        h = self.text_model(input_ids, attention_mask, None, rngs)
        x = self.text_model.pool(h, input_ids)
        return self.text_projection(x) if self.config.family.projections else x

    def scale_logits(self, cosines: jax.Array) -> jax.Array:
        """Cosine similarities as logits: times `exp(logit_scale)` (plus the logit bias)."""
        out = cosines * jnp.exp(self.logit_scale[...]).reshape(())  # SigLIP's (1,): a scalar
        return (out + self.logit_bias[...].reshape(()) if self.config.family.logit_bias
                else out)

    def logits(self, pixel_values: jax.Array, input_ids: jax.Array,
               attention_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """transformers' `(logits_per_image (N, M), logits_per_text (M, N))` of N images
        and M texts."""
        image = normalize(self.get_image_features(pixel_values))
        text = normalize(self.get_text_features(input_ids, attention_mask=attention_mask))
        per_text = self.scale_logits(text @ image.T)
        return per_text.T, per_text

    def __call__(self, pixel_values: jax.Array, *, input_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, rngs: Rngs = None) -> jax.Array:
        """Each image-text pair's logit `(N, 1)` (images `(N, H, W, C)`, token ids `(N, L)`;
        none: the config's `placeholder_ids`)."""
        self.config.check_input(pixel_values.shape, channels_last=True)
        if input_ids is None:
            ids = jnp.asarray(self.config.placeholder_ids())
            input_ids = jnp.broadcast_to(ids, (pixel_values.shape[0], ids.shape[0]))
        image = normalize(self.get_image_features(pixel_values, rngs=rngs))
        text = normalize(self.get_text_features(input_ids, attention_mask=attention_mask,
                                                rngs=rngs))
        return self.scale_logits(jnp.sum(image * text, axis=-1, keepdims=True))
