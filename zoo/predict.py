"""Classify images with a pretrained model: the top classes by name, with their probabilities.

    python -m zoo.predict IMAGE [IMAGE ...] --model vit_small_patch16_224 --impl nnx [--top 5]
    python -m zoo.predict IMAGE --model clip-vit-base-patch16 --labels cat dog   # zero-shot
    python -m zoo.predict --texts "a sentence" "another one" --model all-minilm-l6-v2

`--model` is a name with a pretrained tag (``resnet50.tv_in1k``; an untagged name takes its
default tag, as timm's) or a source (``hf-hub:timm/resnet50.a1_in1k``, ``local-dir:PATH``).
The weights come from the Hugging Face cache (downloaded by ``huggingface_hub`` on first use;
with ``HF_HUB_OFFLINE=1`` only the cache is read), the preprocessing is the tag's (timm's
eval transform) and the names are the tag's label set (ImageNet-1k's ship with the zoo).

In Python, the same in three lines:

    model = zoo.create("vit_small_patch16_224", "nnx", pretrained=True)
    x = zoo.transform(zoo.data_config(model), "nnx")(image)       # a PIL image, path or array
    probs = jax.nn.softmax(zoo.native_interface("nnx").forward(model, x))  # names: zoo.labels

or `classify(model, "nnx", image)`. With `--labels` a CLIP or SigLIP model classifies
zero-shot (`zero_shot(model, impl, images, labels, tokenizer)`: each label read as "a photo
of a {label}.", the model's own `tokenizer.json` from the same cache; docs/zero_shot.md).
With `--texts` an encoder (BERT, RoBERTa, their sentence-embedding checkpoints) embeds the
texts (`zoo.embed`, its tokenizer from the same source): their cosine similarities are
printed, `--out FILE.npy` keeps the vectors (docs/embeddings.md).
Every failure is one ``error: ...`` line (exit 1; 2 for bad
arguments), e.g. when the weights are not in the cache and the machine is offline.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoo.arguments import ArgumentParser
from zoo.configs import ConfigError
from zoo.weights.pretrained import (
    Pretrained,
    data_config,
    label_names,
    made_from,
    resolve,
    transform,
)
from zoo.weights.sources import Source

IMAGE_MODEL = "vit_small_patch16_224"  # the default --model for images
TEXT_MODEL = "all-minilm-l6-v2"  # and for --texts


def _tag_of(model: Any, name: str | None) -> Pretrained | None:
    made = made_from(model)
    if made is None and name is not None:
        made = resolve(name).pretrained
    return made


def classify(model: Any, impl: str, images: Any, *, name: str | None = None, top: int = 5
             ) -> list[list[tuple[str, float]]]:
    """The `top` classes (name, probability) of each image (a PIL image, a path or a uint8
    array; or a list of them) for a `model` made by `zoo.create(..., pretrained=True)` (or
    any model of the pretrained `name`): its tag's preprocessing, an eval-mode forward pass in
    library `impl`, a softmax, its label set's names ("class N" where it names none)."""
    from zoo.libraries import native_interface

    tag = _tag_of(model, name)
    if tag is None:
        raise ConfigError("classify: pass name= (the model's name with its tag): this model "
                          "was not made by zoo.create(..., pretrained=True)")
    many = isinstance(images, list | tuple)
    x = transform(data_config(tag), impl)(list(images) if many else [images])
    logits = np.asarray(native_interface(impl).forward(model, x), np.float64)
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    label_set = tag.fields.get("label_set")
    names = label_names(label_set) if label_set else None
    if names is not None and len(names) != probs.shape[-1]:
        names = None  # another class count (num_classes=...): no names to give
    out = []
    for row in probs:
        best = np.argsort(-row, kind="stable")[:top]
        out.append([(names[i] if names else f"class {i}", float(row[i])) for i in best])
    return out if many else out[:1]


PROMPT = "a photo of a {label}."


def _config(model: Any) -> Any:
    return (model[0] if isinstance(model, tuple) else model).config


def _normalized(x: Any) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True))


def features(model: Any, impl: str, images: Any, input_ids: Any, attention_mask: Any = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """The normalised image features `(N, D)` of N images (the canonical layout,
    `(N, C, H, W)`) and text features `(M, D)` of M texts (token ids `(M, L)`) of a CLIP or
    SigLIP `model` of library `impl`, each tower through the library's interface."""
    from zoo.libraries import native_interface

    api, config = native_interface(impl), _config(model)
    pixels = api.to_native(np.asarray(images, np.float32), config)
    image = _normalized(api.call(model, "get_image_features", pixels))
    mask = None if attention_mask is None else np.asarray(attention_mask, np.int32)
    text = _normalized(api.call(model, "get_text_features", np.asarray(input_ids, np.int32),
                                inputs={"attention_mask": mask}))
    return image, text


def image_text_logits(model: Any, impl: str, images: Any, input_ids: Any,
                      attention_mask: Any = None) -> np.ndarray:
    """`logits_per_image` `(N, M)` of N images and M texts (`features`), as transformers'
    `CLIPModel` / `SiglipModel` compute them: the cosines scaled by the model
    (`scale_logits`: times `exp(logit_scale)`, plus SigLIP's bias)."""
    from zoo.libraries import native_interface

    image, text = features(model, impl, images, input_ids, attention_mask)
    return np.asarray(native_interface(impl).call(model, "scale_logits", image @ text.T),
                      np.float32)


def zero_shot(model: Any, impl: str, images: Any, labels: Sequence[str], tokenizer: Any = None,
              *, prompt: str = PROMPT) -> np.ndarray:
    """Zero-shot classification: the probability `(N, len(labels))` of each label for each
    image, the labels read as `prompt` ("a photo of a {label}.") by the model's text tower:
    a softmax over the labels (CLIP) or each label's sigmoid (SigLIP; `Family.probabilities`).
    `images`: an array `(N, C, H, W)` already preprocessed, or images (PIL, paths, uint8
    arrays) for a model made by `zoo.create(..., pretrained=True)` (its tag's preprocessing).
    `tokenizer`: a `zoo.tokenizer.Tokenizer` (None: the pretrained model's own `tokenizer.json`
    from the same Hub cache as its weights); texts are padded as the family's processor pads
    them (`Family.text_padding`, `text_mask`)."""
    from zoo.tokenizer import load

    config = _config(model)
    family = getattr(config, "family", None)
    if family is None or not hasattr(family, "probabilities"):
        raise ConfigError(f"zero_shot: a {config.arch} model has no text tower (CLIP, SigLIP)")
    if not labels:
        raise ValueError("zero_shot: give at least one label")
    tag = made_from(model)
    if tokenizer is None:
        if tag is None:
            raise ConfigError("zero_shot: pass tokenizer= (zoo.tokenizer.load(FOLDER)): this "
                              "model was not made by zoo.create(..., pretrained=True)")
        tokenizer = load(tag.hub if ":" in tag.hub else f"hf-hub:{tag.hub}")
    pixels = np.asarray(images, np.float32) if _is_batch(images) else _preprocessed(
        tag, images)
    texts = [prompt.format(label=label) for label in labels]
    ids, mask = tokenizer(texts, padding=family.text_padding,
                          max_length=config.max_position_embeddings)
    logits = image_text_logits(model, impl, pixels, ids, mask if family.text_mask else None)
    logits = logits.astype(np.float64)
    if family.probabilities == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    logits = logits - logits.max(axis=-1, keepdims=True)
    return np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)


def _is_batch(images: Any) -> bool:
    return isinstance(images, np.ndarray) and images.ndim == 4 and images.dtype != np.uint8


def _preprocessed(tag: Pretrained | None, images: Any) -> np.ndarray:
    """Images in the canonical layout, by the tag's preprocessing."""
    if tag is None:
        raise ConfigError("zero_shot: pass preprocessed images (N, C, H, W): this model was "
                          "not made by zoo.create(..., pretrained=True)")
    many = isinstance(images, list | tuple)
    return np.asarray(transform(data_config(tag))(list(images) if many else [images]))


def _parser() -> ArgumentParser:
    from zoo.libraries import IMPLS

    p = ArgumentParser(prog="python -m zoo.predict",
                       description="Classify images with a pretrained model (top classes and "
                                   "probabilities).")
    p.add_argument("images", nargs="*", metavar="IMAGE", help="image files (any Pillow reads)")
    p.add_argument("--model", default=None,
                   help="a name with a pretrained tag (resnet50.tv_in1k; untagged: its "
                        f"default tag) or hf-hub:ORG/REPO / local-dir:PATH (default "
                        f"{IMAGE_MODEL}; with --texts {TEXT_MODEL})")
    p.add_argument("--impl", default="nnx", choices=list(IMPLS),
                   help="the library to run it in (default nnx)")
    p.add_argument("--top", type=int, default=5, help="how many classes to print (default 5)")
    p.add_argument("--labels", nargs="+", metavar="LABEL",
                   help="zero-shot classification (a CLIP or SigLIP --model): the labels, "
                        f"read as {PROMPT!r}")
    p.add_argument("--texts", nargs="+", metavar="TEXT",
                   help="sentence embeddings of the texts (an encoder --model): their cosine "
                        "similarities")
    p.add_argument("--pooling", choices=("mean", "cls"), default=None,
                   help="with --texts: how the tokens' states are pooled (default: the "
                        "model's own)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.npy",
                   help="with --texts: write the embeddings (N, E) there (a new file)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def embed_texts(model_name: str, impl: str, texts: Sequence[str], pooling: str | None = None
                ) -> tuple[Pretrained | None, np.ndarray]:
    """The pretrained encoder `model_name`'s embeddings `(N, E)` of `texts`, tokenized by the
    `tokenizer.json` of the same source as its weights."""
    import zoo

    model = zoo.create(model_name, impl, pretrained=True)
    tag = made_from(model)
    source = model_name if Source.parse(model_name) is not None or tag is None else (
        tag.hub if ":" in tag.hub else f"hf-hub:{tag.hub}")
    vectors = zoo.embed(model, impl, list(texts), tokenizer=source, pooling=pooling)
    return tag, np.asarray(vectors, np.float64)


def _print_similarities(texts: Sequence[str], vectors: np.ndarray) -> None:
    """The cosine similarity of every pair of texts, then the texts by number."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = unit @ unit.T
    shown = min(len(texts), 10)  # 80 columns
    print("cosine similarity:")
    print("     " + "".join(f"{f'[{j + 1}]':>7}" for j in range(shown)))
    for i in range(len(texts)):
        print(f"{f'[{i + 1}]':>5}" + "".join(f"{sims[i, j]:7.3f}" for j in range(shown)))
    for i, text in enumerate(texts):
        print(f"[{i + 1}] {text if len(text) <= 72 else text[:69] + '...'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error("--top must be at least 1")
    if bool(args.images) == bool(args.texts):
        parser.error("give images (IMAGE ...) or --texts, not both" if args.images else
                     "give images (IMAGE ...) or --texts TEXT ...")
    if args.texts:
        return _texts_main(args)
    args.model = args.model or IMAGE_MODEL
    try:
        import zoo

        model = zoo.create(args.model, args.impl, pretrained=True)
        tag = made_from(model)
        cfg = data_config(model)
        if args.labels:
            probs = zero_shot(model, args.impl, list(args.images), args.labels)
            results = [sorted(zip(args.labels, map(float, row), strict=True),
                              key=lambda pair: -pair[1])[:args.top] for row in probs]
        else:
            results = classify(model, args.impl, list(args.images), top=args.top)
    except Exception as e:  # one line, whatever failed (--debug for the traceback)
        if args.debug:
            raise
        text = str(e).strip().splitlines()
        print(f"error: {text[0] if text else type(e).__name__}", file=sys.stderr)
        return 1
    _, h, w = cfg["input_size"]
    for image, top in zip(args.images, results, strict=True):
        print(f"{image}: {tag} ({args.impl}; {h}x{w}, {cfg['interpolation']}, crop_pct "
              f"{cfg['crop_pct']})")
        for label, p in top:
            print(f"  {100 * p:6.2f}%  {label}")
    return 0


def _texts_main(args: Any) -> int:
    if args.out is not None and (args.out.exists() or args.out.suffix != ".npy"):
        print(f"error: --out {args.out}: " + ("exists (not overwritten)" if args.out.exists()
                                              else "give a new .npy file"), file=sys.stderr)
        return 2
    name = args.model or TEXT_MODEL
    try:
        tag, vectors = embed_texts(name, args.impl, args.texts, args.pooling)
    except Exception as e:  # one line, whatever failed (--debug for the traceback)
        if args.debug:
            raise
        text = str(e).strip().splitlines()
        print(f"error: {text[0] if text else type(e).__name__}", file=sys.stderr)
        return 1
    print(f"model: {tag or name}")
    print(f"{len(args.texts)} texts -> {vectors.shape[1]} dimensions ({args.impl})")
    _print_similarities(args.texts, vectors)
    if args.out is not None:
        np.save(args.out, vectors.astype(np.float32))
        print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} float32: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
