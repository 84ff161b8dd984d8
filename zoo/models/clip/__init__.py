"""CLIP and SigLIP as two-tower models (transformers' `CLIPModel` / `SiglipModel` names and
arithmetic): the text tower on the shared decoder body, the image tower the zoo's ViT, the
projections and the logit scale (SigLIP's bias); features, image-text logits, zero-shot
classification (`zoo.predict.zero_shot`)."""

from zoo.models.clip.config import ClipConfig
from zoo.registry import register

register(ClipConfig, eqx=".eqx:Clip", linen=".linen:Clip", nnx=".nnx:Clip", torch=".torch:Clip")
