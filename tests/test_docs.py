"""The docs run as written.

Every `python -m zoo.bench ...` / `python -m converters ...` command form in the repository's
Markdown (read from the Markdown here, never listed by hand) runs in a short form, or, where it
cannot be shortened, is parsed up to where its work would start; every Python block runs (Sybil:
a file's blocks in order, in one namespace); the install commands name files and extras that
exist; bad input to any documented command is one `error:` line, exit 2.

A command form new to the docs is placed by three tables: PLACEHOLDERS (a placeholder as the
docs write it -> the value run), FILES (the checkpoints the converter commands read, built
here) and WAYS (how a form runs: flags appended to shorten it, parsed only, or in a fresh
interpreter, and why). A form they cannot place fails `test_every_command_is_placed`, saying
what to add.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import unittest
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from markdown_it import MarkdownIt
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

import zoo
from zoo.weights.sources import Source

ROOT = Path(__file__).resolve().parents[1]
NOT_DOCS = {"build", "dist", "node_modules", "site-packages", "site"}  # and hidden folders
# Written by `python -m zoo.docs.catalogue` from the registry and the parsers' own --help
# (tests/test_docs_site.py checks them): nothing typed by hand to run here.
GENERATED = {"docs/catalogue", "docs/reference"}
MARKDOWN = sorted(p for p in ROOT.rglob("*.md") if not any(
    part.startswith(".") or part in NOT_DOCS for part in p.relative_to(ROOT).parts)
    and p.parent.relative_to(ROOT).as_posix() not in GENERATED)
COMMAND = re.compile(r"python -m (?:zoo\.bench|converters)\b")
PIP = re.compile(r"pip install\b")


# --------------------------------------------------------------------------- reading the docs
def _logical_lines(text: str) -> list[str]:
    """A code block's lines, continuation lines (indented, or after a backslash) joined, shell
    prompts removed."""
    lines: list[str] = []
    for raw in text.splitlines():
        if lines and raw.strip() and (raw[0].isspace() or lines[-1].endswith("\\")):
            lines[-1] = lines[-1].removesuffix("\\").rstrip() + " " + raw.strip()
        else:
            lines.append(raw.strip().removeprefix("$ "))
    return lines


@functools.cache
def markdown_tokens(path: Path) -> tuple[Any, ...]:
    """The Markdown's tokens, parsed once per file for every test that reads them."""
    return tuple(MarkdownIt("commonmark").parse(path.read_text()))


def code_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every line of the Markdown's code blocks and of every inline code span."""
    for token in markdown_tokens(path):
        if token.type in ("fence", "code_block"):
            for line in _logical_lines(token.content):
                yield token.map[0] + 1, line
        elif token.type == "inline":
            for child in token.children or ():
                if child.type == "code_inline":
                    yield token.map[0] + 1, child.content


def shown(pattern: re.Pattern[str]) -> dict[str, str]:
    """Every command the docs show matching `pattern`, as written (a chain split at `&&`, a
    trailing comment dropped, spaces normalised) -> where it is first shown."""
    found: dict[str, str] = {}
    for path in MARKDOWN:
        for line, text in code_texts(path):
            for part in text.split("&&"):
                if (match := pattern.search(part)) is not None:
                    command = re.sub(r"\s+#(\s.*)?$", "", part[match.start():])
                    found.setdefault(" ".join(command.split()),
                                     f"{path.relative_to(ROOT)}:{line}")
    return found


FORMS = shown(COMMAND)


# --------------------------------------------------------------------------- the tables
# A placeholder as the docs write it (with the word before it where the value depends on it)
# -> the value the suite runs, as shell words (of a set of alternatives, the first is run).
PLACEHOLDERS: dict[str, str] = {
    "SRC": "model.pt", "DST": "out", "ARCH": "cnn", "P": "tiny", "PRESET": "convt-256-cpu",
    "JSON_OR_FILE": """'{"arch": "cnn", "batch_norm": true}'""", "DTYPE": "float32",
    "SIZE": "100MB", "N": "2",
    "H,W": "28,28", "C": "1", "S": "0", "DIR": "results", "PATH": "out.json", "M": "9",
    "NAME,...": "concatenate", "--impl ...": "--impl all", "--method ...": "--method phase",
    "breakdown ...": "breakdown vit", "/big/disk": ".", "PARTS": "convt",
    "SOURCE ...": "hf-hub:timm/resnet50.a1_in1k out --to nnx",
}


def _save_torch(state: dict[str, Any], path: Path) -> None:
    import torch

    torch.save({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}, path)


def _save_orbax(tree: Any, path: Path) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:  # as the Flax examples save
        checkpointer.save(path.absolute(), tree)
        checkpointer.wait_until_finished()


def _random(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


def _linen_mnist(path: Path) -> None:
    import jax
    import jax.numpy as jnp

    from tests.foreign_models import LinenMNIST

    shapes = jax.eval_shape(LinenMNIST().init, jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    rng = np.random.default_rng(0)
    _save_orbax(jax.tree.map(lambda a: (0.1 * rng.standard_normal(a.shape)).astype(a.dtype),
                             shapes), path)


def _nnx_mnist(path: Path) -> None:
    from flax import nnx

    from tests.foreign_models import NNXMNIST

    _save_orbax(nnx.split(NNXMNIST(rngs=nnx.Rngs(0)))[1], path)


def _mlp_sequential(path: Path) -> None:
    sizes = (784, 512, 512, 10)
    _save_torch(_random({f"{2 * i}.{k}": (b, a) if k == "weight" else (b,)
                         for i, (a, b) in enumerate(itertools.pairwise(sizes))
                         for k in ("weight", "bias")}), path)


def _ambiguous(path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(_random({"alpha.weight": (8, 8), "alpha.bias": (8,), "beta.weight": (8, 8),
                       "beta.bias": (8,), "head.weight": (3, 8), "head.bias": (3,)}), str(path))


def _zoo_torch(arch: str) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        _save_torch(zoo.create(arch, "torch", seed=0).state_dict(), path)
    return build


def _torchvision_convnext(path: Path) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    torch.save(torchvision.models.convnext_tiny().state_dict(), path)


_TINY_QWEN3 = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 8}


def _hf_qwen3(path: Path) -> None:
    """A Hugging Face folder of a tiny Qwen3 (`save_pretrained`, bfloat16, random weights)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(**_TINY_QWEN3, tie_word_embeddings=True)
    transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def _zoo_qwen3_nnx(path: Path) -> None:
    import converters

    config = zoo.make_config("qwen3-0.6b", **_TINY_QWEN3)
    converters.save(zoo.create(config, "nnx", seed=0), path, "nnx")


def _torchvision_mobilenet(path: Path) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), path)


def _hf_dinov2(path: Path) -> None:
    """A Hugging Face folder of a small random `Dinov2Model` (`save_pretrained`)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=28, patch_size=14)
    transformers.Dinov2Model(config).save_pretrained(path)


def _zoo_nnx(path: Path) -> None:
    import converters

    converters.save(zoo.create("cnn", "nnx", seed=0), path, "nnx")


# The checkpoints the docs' converter commands and Python blocks read, by the name they use.
FILES: dict[str, Callable[[Path], None]] = {
    "model.pt": _zoo_torch("cnn"),  # a bare state_dict of the zoo's CNN
    "model_nnx": _zoo_nnx, "ckpt": _zoo_nnx,  # checkpoints the zoo wrote (config inside)
    "nnx_state": _nnx_mnist, "state": _nnx_mnist,  # the Flax NNX MNIST tutorial's, with orbax
    "linen_mnist": _linen_mnist,  # the Flax Linen MNIST example's variables, with orbax
    "mlp.pt": _mlp_sequential,  # PyTorch's tutorial nn.Sequential MLP
    "mine.safetensors": _ambiguous,  # two same-shaped layers, no order
    "vit_small.pt": _zoo_torch("vit_small_patch16_224"),  # timm's layout
    "tv.pt": _torchvision_convnext,  # torchvision's ConvNeXt-T state_dict (features.N ...)
    "mnv3.pt": _torchvision_mobilenet,  # torchvision's MobileNetV3-small state_dict
    "./dinov2-small": _hf_dinov2, "./hf-model": _hf_dinov2,  # transformers' Dinov2Model
    "./Qwen3-0.6B": _hf_qwen3, "qwen_nnx": _zoo_qwen3_nnx,  # a tiny Qwen3, HF's and the zoo's
}


@dataclass(frozen=True)
class Way:
    """How the forms matching `pattern` (a regex on the form as documented or as `expand`ed)
    run, and `why`: `append`ed flags shorten them (argparse keeps an option's last value, so
    they override the documented ones; `{root}` is the repository), or they `parse` only, up
    to where their work would start (WORK); in a `fresh` interpreter; expecting exit
    `status`."""

    pattern: str
    why: str = ""
    append: tuple[str, ...] = ()
    parse: bool = False
    fresh: bool = False
    status: int = 0


ONE_ROUND = ("--repeat", "1", "--warmup", "0", "--rounds", "1", "--settle", "0",
             "--no-progress")
TINY = ("--preset", "tiny", *ONE_ROUND)
# The first row whose pattern matches a form decides.
WAYS: list[Way] = [
    Way(r"^python -m (converters( convert)?|zoo\.bench( matrix)?)$",
        "the command named in prose: --help",
        append=("--help",)),
    Way(r"\[--|\{\w+,", "a usage synopsis: every option it lists parses", parse=True),
    Way(r"--torch-compile", "torch.compile takes minutes on a CPU", parse=True),
    Way(r"zoo\.bench matrix", "the whole matrix: minutes, even --quick", parse=True),
    Way(r"zoo\.bench gpu", "the GPU run; its --dry-run (2 minutes) runs in test_bench_gpu.py",
        parse=True),
    Way(r"converters (convert|inspect) hf-hub:", "reads the Hub; the pretrained tests read a "
        "cache they lay out", parse=True),
    Way(r"zoo\.bench xla-cpu", "the reproductions need their sizes: 40 s at one round",
        parse=True),
    Way(r"convt-wgrad |--mesh 4x2", "GPU-sized", parse=True),
    Way(r"ARCH --mesh", "the vit form's run on another arch (JAX has started here)", parse=True),
    Way(r"--mesh", "host devices are made before JAX starts: a fresh interpreter; a batch that "
        "splits over 8; one library (every library on a mesh: tests/test_bench_mesh.py)",
        append=(*TINY, "--batch", "8", "--impl", "nnx"), fresh=True),
    Way(r"--xla-cpu-flags", "XLA_FLAGS are set before JAX starts: a fresh interpreter; the "
        "forward pass of one library (the flags reach every program alike)",
        append=(*TINY, "--mode", "forward", "--impl", "eqx"), fresh=True),
    Way(r"zoo\.bench dispatch --record", "the record: one workload (every one runs above)",
        append=("--tiny", "--workload", "identity", "--rounds", "1", "--budget", "0.0002",
                "--no-progress")),
    Way(r"zoo\.bench dispatch", "one workload (every workload in every library: "
        "tests/test_bench_dispatch.py)", append=("--tiny", "--workload", "identity", "--rounds",
                                                 "1", "--budget", "0.0002", "--no-progress")),
    Way(r"zoo\.bench partition", "six training steps compiled (15 s even at two layers); "
        "its record is committed", parse=True),
    Way(r"zoo\.bench report", "over the committed records",
        append=("--results", "{root}/bench/results")),
    Way(r"zoo\.bench breakdown", append=("--preset", "tiny", "--steps", "1")),
    Way(r"zoo\.bench convert", "the smallest size, one conversion",
        append=("--sizes", "vit-tiny", "--sources", "safetensors", "--targets", "eqx")),
    Way(r"zoo\.bench (presets|xla-flags)$"),
    Way(r"mine\.safetensors", "documented as refused", status=1),
    Way(r"^python -m converters (convert|inspect) "),
    Way(r"--mode (prefill|decode)", "a few tokens of the tiny config in one library (every "
        "library's run: tests/test_bench_generation.py)",
        append=(*TINY, "--impl", "eqx", "--prompt", "4", "--new-tokens", "3")),
    Way(rf"^python -m zoo\.bench ({'|'.join(map(re.escape, zoo.ARCHS))}|convt|--)(?!.*--mode)",
        "no mode named: the forward pass (the tiny presets' training: tests/test_bench.py)",
        append=(*TINY, "--mode", "forward")),
    Way(rf"^python -m zoo\.bench ({'|'.join(map(re.escape, zoo.ARCHS))}|convt|--)"
        r"(?!.*--impl)(?!.*--torch)", "a mode in every library by default: its options in one "
        "(every library's tiny training: tests/test_bench.py)", append=(*TINY, "--impl", "eqx")),
    Way(rf"^python -m zoo\.bench ({'|'.join(map(re.escape, zoo.ARCHS))}|convt|--)", append=TINY),
]
# Where each command starts its work: a parsed-only form stops there (the longest prefix wins).
WORK: dict[str, str] = {
    "python -m converters convert": "converters.__main__:_convert",
    "python -m converters inspect": "converters.__main__:_inspect",
    "python -m zoo.bench breakdown": "zoo.bench.subjects:build_models",
    "python -m zoo.bench convert": "zoo.bench.convert:run_size",
    "python -m zoo.bench dispatch": "zoo.bench.dispatch:run_dispatch",
    "python -m zoo.bench matrix": "zoo.bench.matrix:run_slots",
    "python -m zoo.bench partition": "zoo.bench.partition:run_partition",
    "python -m zoo.bench gpu": "zoo.bench.gpu:require_backend",
    "python -m converters convert hf-hub:timm/resnet50.a1_in1k": "converters.__main__:local",
    "python -m converters inspect hf-hub:timm/resnet50.a1_in1k": "converters.__main__:local",
    "python -m zoo.bench report": "zoo.bench.report:render",
    "python -m zoo.bench xla-cpu": "zoo.bench.investigations.xla_cpu:run_repros",
    "python -m zoo.bench": "zoo.bench.runner:run",
}
MAINS = {"zoo.bench": "zoo.bench.cli:main", "converters": "converters.__main__:main"}


# --------------------------------------------------------------------------- placing a form
class Unplaced(Exception):
    """The tables cannot place a documented form; the message says what to add."""


@dataclass(frozen=True)
class Placed:
    form: str
    way: Way
    module: str  # "zoo.bench" or "converters"
    argvs: list[list[str]]  # one per `variant`, placeholders replaced
    work: str | None  # "module:function" where its work starts

    @property
    def short(self) -> list[str]:
        """The (first) command line, shortened."""
        return [*self.argvs[0], *(a.replace("{root}", str(ROOT)) for a in self.way.append)]


def variants(form: str) -> list[str]:
    """A usage synopsis as commands: its required part alone, then with each bracketed option
    in turn (every option it lists parsed, none combined with another); any other form as is."""
    base = re.sub(r"\s*\[--[^\[\]]*\]", "", form)
    return [base, *(f"{base} {g}" for g in re.findall(r"\[(--[^\[\]]*)\]", form))]


def expand(form: str) -> str:
    """A command with the first of each set of alternatives (`{a,b}`, `a|b`, `a | b`) kept and
    its placeholders replaced (PLACEHOLDERS, longest first)."""
    text = re.sub(r"\{([\w-]+),[\w,-]+\}", r"\1", form)
    text = re.sub(r"(\S+) \| \S+", r"\1", text)
    text = re.sub(r"(?<=\s)([\w-]+)(\|[\w-]+)+", r"\1", text)
    for key in sorted(PLACEHOLDERS, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(key)}(?![\w.-])", PLACEHOLDERS[key], text)
    return text


def place(form: str) -> Placed:
    way = next((w for w in WAYS if re.search(w.pattern, form) or re.search(w.pattern,
                                                                            expand(form))), None)
    if way is None:
        raise Unplaced(f"no row of WAYS places `{form}` ({FORMS.get(form)}): add one in "
                       f"{Path(__file__).name} (the flags that shorten it, or parse=True, why)")
    commands = [shlex.split(expand(v)) for v in variants(form)]
    left = [a for c in commands for a in c if re.fullmatch(r"[A-Z][A-Z0-9_]*|.*\.\.\..*", a)]
    if left:
        raise Unplaced(f"`{form}` ({FORMS.get(form)}): no value for {left}: add it to "
                       f"PLACEHOLDERS in {Path(__file__).name}")
    module, base = commands[0][2], " ".join(commands[0])
    work = max((k for k in WORK if base == k or base.startswith(k + " ")), key=len, default=None)
    if way.parse and work is None:
        raise Unplaced(f"`{form}` ({FORMS.get(form)}) parses only: add where its command "
                       f"starts its work to WORK in {Path(__file__).name}")
    return Placed(form, way, module, [c[3:] for c in commands], WORK.get(work))


def _call(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def sources(placed: Placed) -> list[str]:
    """The checkpoints a form reads: a converter command's SRC."""
    if placed.module != "converters" or "--help" in placed.short:
        return []
    from converters.__main__ import _parser

    src = _parser().parse_args(placed.short).src
    if src.startswith(Source.PREFIXES):  # a Hub source: no file of the suite's
        return []
    if src not in FILES:
        raise Unplaced(f"`{placed.form}` reads {src}: add a builder to FILES in "
                       f"{Path(__file__).name}")
    return [src]


def _id(form: str) -> str:
    return form.removeprefix("python -m ")


def _marks(form: str) -> tuple[Any, ...]:
    """Forms that only parse belong to the quick subset; the runs to the full suite."""
    try:
        return () if place(form).way.parse else (pytest.mark.full_only,)
    except Unplaced:
        return ()


def test_every_command_is_placed():
    """Every documented form has a row of WAYS, a value for each placeholder and, for the
    converters, a builder for its source (a form added to the docs fails here otherwise)."""
    problems = []
    for form in FORMS:
        try:
            sources(place(form))
        except Unplaced as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)
    assert len(FORMS) > 40, f"the extraction found only {len(FORMS)} forms"


def test_placing_refuses_what_it_cannot_place():
    with pytest.raises(Unplaced, match="no row of WAYS"):
        place("python -m zoo.bench a-new-subcommand")
    with pytest.raises(Unplaced, match=r"no value for \['NEW_THING'\]: add it to PLACEHOLDERS"):
        place("python -m zoo.bench cnn --config NEW_THING")
    with pytest.raises(Unplaced, match="add a builder to FILES"):
        sources(place("python -m converters convert other.pt out --to nnx"))


# --------------------------------------------------------------------------- running a form
class Started(BaseException):
    """Raised where a parsed-only command would start its work (no `except Exception` in a
    command catches it)."""


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`checkpoint(name)`: FILES[name], built once per session."""
    cache = tmp_path_factory.mktemp("doc-files")

    def get(name: str) -> Path:
        path = cache / name
        if not path.exists():
            FILES[name](path)
        return path
    return get


def lay_out(names: list[str], where: Path, checkpoint: Callable[[str], Path]) -> None:
    for name in names:
        src = checkpoint(name)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, where / name)


def in_process(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]
               ) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m module argv`, run by its `main`."""
    try:
        code = _call(MAINS[module])(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def fresh(placed: Placed, cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", placed.module, *placed.short], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def command_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch working folder; the tree under test for the commands' own subprocesses;
    PyTorch's thread count restored."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("COLUMNS", "80")
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    yield tmp_path
    if threads:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("form", [pytest.param(f, marks=_marks(f), id=_id(f)) for f in FORMS])
def test_documented_command(form, command_env, monkeypatch, capsys, checkpoint):
    """The form runs shortened and ends with its documented status, or parses up to where its
    work would start."""
    try:
        placed = place(form)
        lay_out(sources(placed), command_env, checkpoint)
    except Unplaced as e:
        pytest.fail(str(e))
    if placed.way.parse:
        module, name = placed.work.split(":")

        def started(*args: Any, **kwargs: Any) -> None:
            raise Started(placed.work)
        monkeypatch.setattr(importlib.import_module(module), name, started)
        for argv in placed.argvs:
            with pytest.raises(Started):
                in_process(placed.module, argv, capsys)
        return
    code, out, err = (fresh(placed, command_env) if placed.way.fresh
                      else in_process(placed.module, placed.short, capsys))
    assert code == placed.way.status, f"{' '.join(placed.short)}: exit {code}\n{out}\n{err}"
    assert "Traceback" not in err, err
    assert out or err  # it said something


# --------------------------------------------------------------------------- install commands
def test_install_commands_name_what_exists():
    """The docs' `pip install` commands (never run here) install requirement (and constraint)
    files that exist and extras the project declares; their `python -m` parts run above (the
    README's test command is CI's, `tests/test_readme.py`)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    commands = shown(PIP)
    assert commands
    for command, where in commands.items():
        words = shlex.split(command)
        for flag, value in itertools.pairwise(words):
            if flag in ("-r", "-c"):
                assert (ROOT / value).is_file(), f"{where}: {value}"
            if flag == "-e" and (match := re.fullmatch(r"\.\[([\w,-]+)\]", value)):
                assert set(match[1].split(",")) <= set(extras), f"{where}: {value}"


# --------------------------------------------------------------------------- Python blocks
# Sybil runs a file's Python blocks in order in one namespace (doctest blocks, `>>>`, compare
# their output). Markers, in the Markdown: `<!-- skip: next "why" -->` before a block not meant
# to run (a reason is required), `<!-- invisible-code-block: python ... -->` for what a
# fragment needs; a warning a block raises is shown in it as `# SomeWarning: message` (a prefix
# of the message, `...` allowed at its end), and only those.
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
SHOWN_WARNING = re.compile(r"^\s*# (\w+Warning): (.+?)(?:\s*\.\.\.)?$", re.M)


def python_fences(path: Path) -> list[range]:
    """The lines of each Python block."""
    return [range(t.map[0] + 1, t.map[1] + 1) for t in markdown_tokens(path)
            if t.type == "fence" and t.info.split()[:1] in (["python"], ["py"])]


def _warned(example: Any) -> None:
    """Evaluate `example`; the warnings it raises must be the ones it shows."""
    text = example.document.text[example.start:example.end]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        example.evaluate()
    raised = sorted((w.category.__name__, str(w.message)) for w in caught)
    shown = sorted(SHOWN_WARNING.findall(text))
    assert len(raised) == len(shown) and all(
        r[0] == s[0] and r[1].startswith(s[1]) for r, s in zip(raised, shown, strict=True)), (
        f"{example.path}:{example.line} raises {raised}, shows {shown}")


# Left out of --quick, as conftest's FULL_ONLY: reference-model features (getting started
# adapts a timm ViT-S checkpoint and runs ResNet-18 at 224x224; zero-shot runs CLIP and SigLIP
# in every library, which tests/test_clip.py checks in the subset).
FULL_ONLY_BLOCKS = {"README.md", "docs/getting_started.md", "docs/zero_shot.md"}


@pytest.mark.parametrize("path", [
    pytest.param(p, id=str(p.relative_to(ROOT)), marks=(
        pytest.mark.full_only,) if str(p.relative_to(ROOT)) in FULL_ONLY_BLOCKS else ())
    for p in MARKDOWN if python_fences(p)])
def test_python_blocks(path, tmp_path, monkeypatch, checkpoint):
    """Every Python block runs (or is marked skipped, with why), in a scratch folder holding
    the checkpoints it names; what a block registers is gone afterwards."""
    from sybil.evaluators.skip import Skipper

    from zoo.libraries import registered
    from zoo.registry import restoring

    document = SYBIL.parse(path)
    examples = list(document)
    skips = [e for e in examples if isinstance(e.region.evaluator, Skipper)]
    assert all(reason for action, reason in (e.parsed for e in skips) if action != "end"), (
        f"{path}: every skip needs its reason: <!-- skip: next \"why\" -->")
    seen = [e.line for e in examples if e not in skips]
    unseen = [f.start for f in python_fences(path) if not any(line in f for line in seen)]
    assert not unseen, f"{path}: Python blocks Sybil does not see, lines {unseen}"
    monkeypatch.chdir(tmp_path)
    lay_out([n for n in FILES if f'"{n}"' in document.text], tmp_path, checkpoint)
    with restoring(), registered():
        for example in examples:
            with contextlib.suppress(unittest.SkipTest):
                _warned(example)


# --------------------------------------------------------------------------- bad input
# An option -> a value every documented command that takes it refuses.
BAD: dict[str, str] = {
    "--impl": "jax", "--preset": "nope", "--workload": "nope", "--mode": "nope",
    "--method": "nope", "--dtype": "float8", "--precision": "nope", "--strategy": "nope",
    "--mesh": "0", "--xla-cpu-flags": "--xla_nope", "--rounds": "0", "--repeat": "0",
    "--batch": "0", "--steps": "0", "--steps-per-call": "0", "--torch-threads": "0",
    "--budget": "-1", "--budget-min": "0", "--sizes": "nope", "--only": "nope",
    "--scratch": "no/such/folder", "--results": "no/such/folder", "--arch": "nope",
    "--config": "{", "--to": "nope", "--cast": "float8", "--weights": "nope",
    "--num-classes": "x", "--image-size": "x", "--in-channels": "x", "--shard-size": "x",
}


def bad_inputs(placed: Placed) -> list[list[str]]:
    """The form with an unknown option, with each BAD value it can take, and with its sources
    missing."""
    argv, missing = placed.argvs[0], set(sources(placed))
    cases = [[*argv, "--no-such-option"]]
    cases += [[*argv[:i + 1], BAD[a], *argv[i + 2:]] for i, a in enumerate(argv[:-1])
              if a in BAD]
    if missing:
        cases.append([f"missing_{a}" if a in missing else a for a in argv])
    return cases


@pytest.mark.parametrize("form", [pytest.param(f, id=_id(f)) for f in FORMS])
def test_documented_command_refuses_bad_input(form, command_env, monkeypatch, capsys):
    """Bad input to a documented command is one `error:` line, exit 2, before any work."""
    placed = place(form)
    if placed.work:
        module, name = placed.work.split(":")
        monkeypatch.setattr(importlib.import_module(module), name,
                            lambda *a, **k: pytest.fail(f"{placed.work} started"))
    for argv in bad_inputs(placed):
        code, out, err = in_process(placed.module, argv, capsys)
        assert (code, err.count("\n")) == (2, 1) and err.startswith("error: "), (
            f"python -m {placed.module} {shlex.join(argv)}: exit {code}\n{out}{err}")
