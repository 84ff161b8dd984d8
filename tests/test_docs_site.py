"""The documentation site: `mkdocs build --strict` passes (every link, anchor, page and API
target resolves), and its generated pages are the registry's (`python -m zoo.docs.catalogue`).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo.docs import catalogue

ROOT = Path(__file__).resolve().parents[1]


def test_generated_pages_are_the_registrys():
    """The catalogue, the figures and the CLI page as the registry, the tag table, the
    benchmark records and the parsers give them now (in a fresh interpreter: the suite's toy
    architectures are no part of the zoo)."""
    done = subprocess.run([sys.executable, "-m", "zoo.docs.catalogue", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.parametrize("name", ["cnn", "resnet18", "vit_tiny_patch16_224", "gpt2"])
def test_figures_count_again_alike(name):
    """A committed figure is what the counting gives now (the cache is keyed by config only)."""
    known = json.loads(catalogue.FIGURES.read_text())[name]
    config = zoo.make_config(name)
    assert known["config"] == config.to_json()
    assert known["params"] == catalogue.parameter_count(config)
    assert known["flops"] == catalogue.forward_flops(config)


def test_parameter_counts_are_the_references():
    """The counts agree with the references' own, pinned in tests/fixtures (torchvision,
    timm, transformers)."""
    figures = json.loads(catalogue.FIGURES.read_text())
    pinned = {n: e["params"] for f in ("named_torchvision_resnet.json", "named_timm_vit.json")
              for n, e in json.loads((ROOT / "tests" / "fixtures" / f).read_text())[
                  "models"].items()}
    pinned |= {n: e["parameters"] for n, e in json.loads(
        (ROOT / "tests" / "fixtures" / "named_hf_language_models.json").read_text()).items()
        if isinstance(e, dict)}
    assert {n: figures[n]["params"] for n in pinned} == pinned


def test_every_reference_names_a_test_file():
    for arch in zoo.ARCHS:
        config = zoo.architecture(arch).config
        assert config.REFERENCES or not config.NAMED, f"{arch}: named models, no REFERENCES"
        for ref, test in {**config.REFERENCES, **catalogue.COMMON_TESTS}.items():
            assert (ROOT / test).is_file(), f"{arch}: {ref!r} names {test}, not a file"


NO_MKDOCS = importlib.util.find_spec("mkdocs") is None
WHY = "MkDocs is not installed (the docs and dev extras install it)"


@pytest.mark.skipif(NO_MKDOCS, reason=WHY)
def test_results_pages_put_each_devices_summary_first():
    from zoo.docs import hooks

    text = (ROOT / "bench" / "README.md").read_text()
    pages = hooks.results_pages(text)
    _, devices, _ = hooks.split_report(text)
    assert set(pages) == {"results/index.md", *(f"results/{d}.md" for d in devices)}
    index = pages["results/index.md"]
    for device in devices:
        assert index.index("### Summary") < index.index(f"]({device}.md)")
        assert "](../docs/" not in pages[f"results/{device}.md"]


@pytest.mark.skipif(NO_MKDOCS, reason=WHY)
def test_site_builds_strict(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "catalogue" / "resnet" / "index.html").is_file()
