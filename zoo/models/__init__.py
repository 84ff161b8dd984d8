"""Model definitions: one package per architecture, one module per library."""
