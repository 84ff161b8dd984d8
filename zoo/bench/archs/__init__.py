"""The benchmark's subjects, one module each: the zoo architectures' specs (named after the
architecture) and the subjects that are not zoo models (`convt`). Importing this package
registers them all (`zoo.bench.spec.register`)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
