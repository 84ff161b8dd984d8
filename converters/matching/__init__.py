"""Bring your own checkpoint: match the layers of models and checkpoints the zoo did not build
to a zoo architecture or to a user's own model, by names, user rules, then structure (kind,
order, shapes), with a table of every decision and a forward check on the spot."""

from converters.matching.match import MatchError, Row, TargetLayer, match, render
from converters.matching.sources import SourceLayer, from_flat, from_model
from converters.matching.transfer import Result, import_state, source_layers, transfer

__all__ = ["MatchError", "Result", "Row", "SourceLayer", "TargetLayer", "from_flat",
           "from_model", "import_state", "match", "render", "source_layers", "transfer"]
