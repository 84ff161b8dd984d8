"""The one error of conversions."""


class ConversionError(ValueError):
    """A state does not fit a model, or a model holds arrays no rule converts; the message
    names every offending key."""


class StateMismatchError(ConversionError):
    """A state's keys or shapes are not those of the model's config (another model, or
    another config of the architecture)."""


class KeyMismatchError(StateMismatchError):
    """The state's key names are not the model's: missing or unexpected keys (a checkpoint
    written by other code, whose layers `converters.matching` may still match by structure)."""
