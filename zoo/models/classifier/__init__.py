"""timm's classifier API (`forward_features`, `forward_head`, `reset_classifier`), written once
per library: a model subclasses `eqx.Classifier`, `linen.Classifier`, `nnx.Classifier` or
`torch.Classifier`, names its classifier Linear (`CLASSIFIER`, a dotted path such as
"head.fc"), and writes `pre_logits` (its features to the classifier's input) and
`forward_intermediates`; the rest follows. The classifier takes `config.features` inputs.
"""
