"""Subjects of the benchmark that are not zoo models, one module each; importing this package
registers them all (`zoo.bench.spec.register`)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
