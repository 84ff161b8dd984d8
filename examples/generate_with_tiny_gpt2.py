"""Train a byte-level BPE tokenizer and a tiny GPT-2 on the project's own docs, generate, then
show that every library and `transformers` continue a prompt with the same tokens.

    python examples/generate_with_tiny_gpt2.py [--steps 300] [--impl nnx] [--out-dir DIR]

1. `tokenizers`' byte-level BPE learns a vocabulary from the repository's Markdown;
2. a GPT-2 of width 64 (2 layers) trains on it in one library (`--impl`) with `zoo.runtime.fast`'s
   training step and the next-token loss, under a progress bar (a few minutes on a CPU at the
   default 300 steps; the tests run a handful);
3. `zoo.generate` continues a prompt greedily;
4. the trained weights go to the three other libraries (`converters.convert`) and to a Hugging
   Face folder (`converters.save(..., "hub")`, with the tokenizer), which `transformers` loads;
5. every library and `transformers`' `generate` continue the prompt: the same tokens, checked.

Without `--out-dir` the Hugging Face folder goes to a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

try:
    import zoo
except ImportError:  # running from a checkout without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import zoo

import numpy as np
import optax

import converters
from zoo.runtime import fast
from zoo.runtime.training import next_token

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("eqx", "linen", "nnx", "torch")


def corpus() -> str:
    """The repository's Markdown: README and docs."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(p.read_text() for p in files)


def train_tokenizer(text: str, vocab: int) -> object:
    """A byte-level BPE tokenizer (GPT-2's kind) of `vocab` tokens learnt from `text`."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([text], vocab_size=vocab, min_frequency=2,
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    return tokenizer


def batches(ids: np.ndarray, batch: int, length: int, seed: int):
    """Endless random windows `(batch, length)` of the token stream."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(ids) - length, batch)
        yield np.stack([ids[s:s + length] for s in starts]).astype(np.int32)


def train(config: zoo.Config, impl: str, ids: np.ndarray, args: argparse.Namespace) -> object:
    """The model of `impl` after `args.steps` AdamW steps on the next-token loss."""
    from rich.console import Console

    from zoo.progress import progress

    model = zoo.create(config, impl, seed=args.seed)
    step = fast.train_step(model, impl, optax.adamw(args.lr), next_token)
    data = batches(ids, args.batch_size, config.length, args.seed)
    with progress(Console()) as bar:
        task = bar.add_task(f"training a tiny GPT-2 in {impl}", total=args.steps)
        for _, x in zip(range(args.steps), data, strict=False):
            loss = float(step(x, x))
            bar.update(task, advance=1, description=f"training in {impl}: loss {loss:.3f}")
    print(f"trained {args.steps} steps in {impl}: loss {loss:.3f}")
    return step.model()


def hub_folder(model: object, impl: str, tokenizer: object, path: Path) -> None:
    """A `save_pretrained`-style folder: config.json, model.safetensors and the tokenizer."""
    from transformers import PreTrainedTokenizerFast

    converters.save(model, path, "hub", impl=impl)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer._tokenizer,
                            eos_token="<|endoftext|>").save_pretrained(path)


def continuations(models: dict[str, object], folder: Path, prompt: np.ndarray,
                  new: int) -> dict[str, np.ndarray]:
    """Each library's and `transformers`' greedy continuation of `prompt` `(1, L)`."""
    import torch
    import transformers

    out = {impl: np.asarray(zoo.generate(m, impl, prompt, max_new_tokens=new))
           for impl, m in models.items()}
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out["transformers"] = hf.generate(torch.from_numpy(prompt).long(), do_sample=False,
                                          max_new_tokens=new, eos_token_id=None,
                                          pad_token_id=0).numpy()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=IMPLS[:3], default="nnx", help="the library to train in")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--prompt", default="The zoo's models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None, help="keep the Hugging Face folder here")
    args = p.parse_args(argv)

    text = corpus()
    tokenizer = train_tokenizer(text, args.vocab)
    ids = np.asarray(tokenizer.encode(text).ids)
    print(f"tokenizer: {tokenizer.get_vocab_size()} tokens; corpus: {len(ids)} tokens")
    config = zoo.make_config("gpt2", vocab_size=tokenizer.get_vocab_size(), n_positions=128,
                             n_embd=64, n_layer=2, n_head=4, embd_pdrop=0.0, attn_pdrop=0.0,
                             resid_pdrop=0.0, seq_len=args.seq_len)
    trained = train(config, args.impl, ids, args)
    prompt = np.asarray([tokenizer.encode(args.prompt).ids], np.int32)
    sample = zoo.generate(trained, args.impl, prompt, max_new_tokens=args.new_tokens)
    print(f"{args.impl} continues {args.prompt!r}: "
          f"{tokenizer.decode(np.asarray(sample)[0].tolist())!r}")

    models = {impl: trained if impl == args.impl else
              converters.convert(trained, args.impl, impl) for impl in IMPLS}
    if args.out_dir is not None:  # made as the other examples make theirs
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.out_dir or tmp) / "tiny-gpt2-hf"
        hub_folder(trained, args.impl, tokenizer, folder)
        out = continuations(models, folder, prompt, args.new_tokens)
    reference = out["transformers"]
    for name, tokens in out.items():
        same = tokens.shape == reference.shape and bool((tokens == reference).all())
        print(f"{name:>12}: {tokenizer.decode(tokens[0, prompt.shape[1]:].tolist())!r}"
              f"{'' if same else '  <- DIFFERENT'}")
    if not all(t.shape == reference.shape and (t == reference).all() for t in out.values()):
        print("the continuations differ")
        return 1
    print(f"same {args.new_tokens} tokens in {', '.join(out)}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
