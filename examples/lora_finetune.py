"""Fine-tune a tiny GPT-2 with LoRA in one library, export the adapter as peft's files, and
show that transformers + peft and every library continue a prompt with the same tokens.

    python examples/lora_finetune.py [--impl nnx] [--base-steps 100] [--steps 200] [--out-dir D]

1. the tokenizer and the GPT-2 (width 64, 2 layers) of `generate_with_tiny_gpt2.py`, trained
   whole for `--base-steps` on the project's docs: the base model;
2. LoRA on its `c_attn` projections (`zoo.lora.add`), fine-tuned for `--steps` with
   `zoo.runtime.fast`'s step training the factors alone (`trainable=zoo.lora.TRAINABLE`), under a
   progress bar, on the docs' text;
3. the adapter written as peft writes it (`zoo.lora.save`: `adapter_config.json`,
   `adapter_model.safetensors`) beside the base model's Hugging Face folder;
4. transformers + peft load both (`PeftModel.from_pretrained`), and every library loads the
   adapter onto its own copy of the base (`zoo.lora.load`);
5. every one continues the prompt greedily (the zoo's through `zoo.lora.merge`, a plain model
   computing the same function): the same tokens, checked.

Without `--out-dir` the folders go to a temporary folder, removed at the end.
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
from generate_with_tiny_gpt2 import batches, corpus, hub_folder, train_tokenizer

import converters
import zoo.lora
from zoo.runtime import fast
from zoo.runtime.training import next_token

IMPLS = ("eqx", "linen", "nnx", "torch")


def train(model: object, impl: str, ids: np.ndarray, steps: int, what: str,
          args: argparse.Namespace, trainable: object = None) -> object:
    """`model` after `steps` AdamW steps on the next-token loss (the `trainable` part only)."""
    from rich.console import Console

    from zoo.progress import progress

    step = fast.train_step(model, impl, optax.adamw(args.lr), next_token, trainable=trainable)
    data = batches(ids, args.batch_size, args.seq_len, args.seed)
    loss = float("nan")
    with progress(Console()) as bar:
        task = bar.add_task(f"{what} in {impl}", total=steps)
        for _, x in zip(range(steps), data, strict=False):
            loss = float(step(x, x))
            bar.update(task, advance=1, description=f"{what} in {impl}: loss {loss:.3f}")
    print(f"{what}: {steps} steps in {impl}, loss {loss:.3f}")
    return step.model()


def peft_continuation(base_folder: Path, adapter: Path, prompt: np.ndarray,
                      new: int) -> np.ndarray:
    """transformers' base model with peft's adapter: its greedy continuation."""
    import peft
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    base = transformers.AutoModelForCausalLM.from_pretrained(base_folder)
    model = peft.PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        return model.generate(input_ids=torch.from_numpy(prompt).long(), do_sample=False,
                              max_new_tokens=new, eos_token_id=None, pad_token_id=0).numpy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=IMPLS[:3], default="nnx", help="the library to train in")
    p.add_argument("--base-steps", type=int, default=100)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--prompt", default="LoRA in every library")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None, help="keep the base folder and the adapter here")
    args = p.parse_args(argv)

    text = corpus()
    tokenizer = train_tokenizer(text, args.vocab)
    ids = np.asarray(tokenizer.encode(text).ids)
    config = zoo.make_config("gpt2", vocab_size=tokenizer.get_vocab_size(), n_positions=128,
                             n_embd=64, n_layer=2, n_head=4, embd_pdrop=0.0, attn_pdrop=0.0,
                             resid_pdrop=0.0, seq_len=args.seq_len)
    base = train(zoo.create(config, args.impl, seed=args.seed), args.impl, ids,
                 args.base_steps, "the base model", args)
    lora = zoo.lora.add(base, args.impl, rank=args.rank, alpha=args.alpha, targets=("c_attn",),
                        seed=args.seed)
    tuned = train(lora, args.impl, ids, args.steps, "LoRA fine-tuning", args,
                  trainable=zoo.lora.TRAINABLE)
    prompt = np.asarray([tokenizer.encode(args.prompt).ids], np.int32)
    if args.out_dir is not None:  # made as the other examples make theirs
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out_dir or tmp)
        hub_folder(base, args.impl, tokenizer, root / "base")
        zoo.lora.save(tuned, args.impl, root / "adapter", base_model_name_or_path="base")
        print(f"wrote peft's adapter to {root / 'adapter'}")
        for impl in IMPLS:
            own = zoo.lora.load(converters.convert(base, args.impl, impl), impl,
                                root / "adapter")
            out[impl] = np.asarray(zoo.generate(zoo.lora.merge(own, impl), impl, prompt,
                                                max_new_tokens=args.new_tokens))
        out["transformers+peft"] = peft_continuation(root / "base", root / "adapter", prompt,
                                                     args.new_tokens)
    reference = out["transformers+peft"]
    same = {k: v.shape == reference.shape and bool((v == reference).all())
            for k, v in out.items()}
    for name, tokens in out.items():
        print(f"{name:>17}: {tokenizer.decode(tokens[0, prompt.shape[1]:].tolist())!r}"
              f"{'' if same[name] else '  <- DIFFERENT'}")
    if not all(same.values()):
        print("the continuations differ")
        return 1
    print(f"same {args.new_tokens} tokens in {', '.join(out)}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
