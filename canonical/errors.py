"""The one error of conversions."""


class ConversionError(ValueError):
    """A state does not fit a model, or a model holds arrays no rule converts; the message
    names every offending key."""
