"""CI installs every extra and the reference libraries: there, a missing optional dependency is
a failure, not a skip."""

from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI guarantees the torch extra")
def test_ci_has_torch_so_no_reference_test_is_skipped():
    assert importlib.util.find_spec("torch") is not None, "CI must install the torch extra"


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI guarantees the dev extra")
@pytest.mark.parametrize("module", ["torchvision", "timm", "transformers"])
def test_ci_has_the_reference_libraries(module):
    """The torchvision, timm and transformers reference tests must run in CI, not skip."""
    assert importlib.util.find_spec(module) is not None, (
        f"CI must install {module} (requirements/torch.txt, then the dev extra)")
