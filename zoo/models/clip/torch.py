"""CLIP and SigLIP in PyTorch, the reference: the text tower on the shared body
(`zoo.models.decoder.torch`, at `text_model`), the zoo's ViT (at `vision_model`), the
projections and the logit scale (and bias) with transformers' names; batched inputs."""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.clip.config import ClipConfig
from zoo.models.decoder.torch import Decoder
from zoo.models.vit.torch import ViT


def normalize(x: torch.Tensor) -> torch.Tensor:
    """`x` over its L2 norm along the last axis, as transformers' `_get_vector_norm`."""
    return x / torch.pow(torch.sum(torch.pow(x, 2), dim=-1, keepdim=True), 0.5)


class Clip(nn.Module):
    """transformers' `CLIPModel` (or `SiglipModel`, `config.model_type`)."""

    def __init__(self, config: ClipConfig) -> None:
        super().__init__()
        f, p = config.family, config.projection_dim
        self.config = config
        self.logit_scale = nn.Parameter(torch.full(f.scale_shape,
                                                   config.logit_scale_init_value))
        if f.logit_bias:
            self.logit_bias = nn.Parameter(torch.full((1,), config.logit_bias_init_value))
        self.text_model = Decoder(config.decoder)
        self.vision_model = ViT(config.vision)
        if f.projections:
            self.visual_projection = nn.Linear(config.vision_hidden_size, p, bias=False)
            self.text_projection = nn.Linear(config.text_hidden_size, p, bias=False)

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The images' features `(N, projection_dim)` (not normalised)."""
        x = self.vision_model(pixel_values)
        return self.visual_projection(x) if self.config.family.projections else x

    def get_text_features(self, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The texts' features `(N, projection_dim)` (not normalised) of token ids `(N, L)`."""
        h = self.text_model(input_ids, attention_mask, None, None)
        x = self.text_model.pool(h, input_ids)
        return self.text_projection(x) if self.config.family.projections else x

    def scale_logits(self, cosines: torch.Tensor) -> torch.Tensor:
        """Cosine similarities as logits: times `exp(logit_scale)` (plus the logit bias)."""
        out = cosines * self.logit_scale.exp()
        return out + self.logit_bias if self.config.family.logit_bias else out

    def logits(self, pixel_values: torch.Tensor, input_ids: torch.Tensor,
               attention_mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' `(logits_per_image (N, M), logits_per_text (M, N))` of N images
        and M texts."""
        image = normalize(self.get_image_features(pixel_values))
        text = normalize(self.get_text_features(input_ids, attention_mask))
        per_text = self.scale_logits(text @ image.T)
        return per_text.T, per_text

    def forward(self, pixel_values: torch.Tensor, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Each image-text pair's logit `(N, 1)` (images `(N, C, H, W)`, token ids `(N, L)`;
        none: the config's `placeholder_ids`)."""
        self.config.check_input(pixel_values.shape)
        if input_ids is None:
            ids = torch.from_numpy(self.config.placeholder_ids()).to(pixel_values.device)
            input_ids = ids[None].expand(pixel_values.shape[0], -1)
        image = normalize(self.get_image_features(pixel_values))
        text = normalize(self.get_text_features(input_ids, attention_mask))
        return self.scale_logits((image * text).sum(-1, keepdim=True))
