"""CLIP and SigLIP in Equinox: the text tower on the shared body (`zoo.models.decoder.eqx`,
at `text_model`), the zoo's ViT (at `vision_model`), the projections and the logit scale (and
bias) with transformers' names; one image and one text per call (batched with vmap; `logits`
takes batches)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.eqx import Linear
from zoo.models.clip.config import ClipConfig
from zoo.models.common import dtype_of
from zoo.models.decoder.eqx import Decoder, make_decoder
from zoo.models.vit.eqx import ViT

Key = PRNGKeyArray | None


def normalize(x: Array) -> Array:
    """`x` over its L2 norm along the last axis, as transformers' `_get_vector_norm`."""
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))


class Clip(eqx.Module):
    """transformers' `CLIPModel` (or `SiglipModel`, `config.model_type`); the fields the
    family has not are None."""

    logit_scale: Array
    logit_bias: Array | None
    text_model: Decoder
    vision_model: ViT
    visual_projection: Linear | None
    text_projection: Linear | None
    config: ClipConfig = eqx.field(static=True)

    def __init__(self, config: ClipConfig, *, key: PRNGKeyArray, dtype: Any = None) -> None:
        dt, f, p = dtype_of(dtype), config.family, config.projection_dim
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.logit_scale = jnp.full(f.scale_shape, config.logit_scale_init_value, dt)
        self.logit_bias = (jnp.full((1,), config.logit_bias_init_value, dt) if f.logit_bias
                           else None)
        self.text_model = make_decoder(config.decoder, key=k1, dtype=dt)
        self.vision_model = ViT(config.vision, key=k2, dtype=dt)
        linear = lambda i, k: Linear(i, p, use_bias=False, key=k, dtype=dt)
        self.visual_projection = linear(config.vision_hidden_size, k3) if f.projections else None
        self.text_projection = linear(config.text_hidden_size, k4) if f.projections else None
        self.config = config

    def get_image_features(self, pixel_values: Array, *, key: Key = None) -> Array:
        """One image's features `(projection_dim,)` (not normalised)."""
        x = self.vision_model(pixel_values, key=key)
        return x if self.visual_projection is None else self.visual_projection(x)

    def get_text_features(self, input_ids: Array, *, attention_mask: Array | None = None,
                          key: Key = None) -> Array:
        """One text's features `(projection_dim,)` (not normalised) of token ids `(L,)`."""
        h, _ = self.text_model(input_ids, attention_mask, None, None, key)
        x = self.text_model.pool(h, input_ids)
        return x if self.text_projection is None else self.text_projection(x)

    def scale_logits(self, cosines: Array) -> Array:
        """Cosine similarities as logits: times `exp(logit_scale)` (plus the logit bias)."""
        out = cosines * jnp.exp(self.logit_scale).reshape(())  # SigLIP's (1,): a scalar
        return out if self.logit_bias is None else out + self.logit_bias.reshape(())

    def logits(self, pixel_values: Array, input_ids: Array,
               attention_mask: Array | None = None) -> tuple[Array, Array]:
        """transformers' `(logits_per_image (N, M), logits_per_text (M, N))` of a batch of N
        images and one of M texts."""
        image = normalize(jax.vmap(self.get_image_features)(pixel_values))
        text = normalize(jax.vmap(lambda i, m: self.get_text_features(i, attention_mask=m))(
            input_ids, attention_mask))
        per_text = self.scale_logits(text @ image.T)
        return per_text.T, per_text

    def __call__(self, pixel_values: Array, *, input_ids: Array | None = None,
                 attention_mask: Array | None = None, key: Key = None) -> Array:
        """The image-text pair's logit `(1,)` of one image `(C, H, W)` and token ids `(L,)`
        (none: the config's `placeholder_ids`)."""
        self.config.check_input(pixel_values.shape, batched=False)
        k1, k2 = (None, None) if key is None else jax.random.split(key)
        ids = jnp.asarray(self.config.placeholder_ids()) if input_ids is None else input_ids
        image = normalize(self.get_image_features(pixel_values, key=k1))
        text = normalize(self.get_text_features(ids, attention_mask=attention_mask, key=k2))
        return self.scale_logits(jnp.sum(image * text, keepdims=True))
