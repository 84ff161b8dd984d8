"""Weights: where they come from and how they reach a model. The canonical initialisation
(`init`), checkpoint files and states adapted to a config (`loading`, with timm's pretrained
adaptations in `adaptation`), the Hub and local sources (`sources`) and pretrained weights by
name (`pretrained`)."""
