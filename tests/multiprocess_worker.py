"""Data-parallel training steps of a zoo model over 4 CPU devices: in one process (`--processes
1`), or in one of 2 processes of 2 devices each (`--processes 2 --process-id I --port P`,
`jax.distributed` over 127.0.0.1 with gloo collectives). Prints the losses and the trained
parameters as JSON on its last line; tests/test_multiprocess.py compares the two runs."""

from __future__ import annotations

import argparse
import json

import jax

DEVICES = 4
BATCH = 8
STEPS = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, choices=(1, 2), required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", DEVICES // args.processes)
    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.processes,
                                   process_id=args.process_id, initialization_timeout=60)

    import numpy as np
    import optax

    import zoo
    import zoo.runtime.fast
    from zoo.runtime import precision, sharding
    from zoo.runtime.training import LOSSES, targets

    precision.set_global(precision.EXACT)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), (sharding.DATA,))  # process-major
    cfg = zoo.tiny_config("cnn")
    impl = zoo.JAX_IMPLS[-1]
    api = zoo.interface(impl)
    model = zoo.create(cfg, impl, mesh=mesh, strategy="dp")
    step = zoo.runtime.fast.train_step(model, impl, optax.sgd(0.1, momentum=0.9), LOSSES[cfg.LOSS],
                               mesh=mesh)
    rows = slice(args.process_id * BATCH // args.processes,
                 (args.process_id + 1) * BATCH // args.processes)
    losses = []
    for i in range(STEPS):
        x = np.asarray(api.to_native(zoo.example_input(cfg, BATCH, seed=i)))
        t = np.asarray(targets(cfg, BATCH, jax.random.key(100 + i)))
        local = [jax.make_array_from_process_local_data(sharding.batch_sharding(mesh), a[rows])
                 for a in (x, t)]
        losses.append(float(step(*local)))
    params = np.concatenate([np.asarray(a).ravel() for a in jax.tree.leaves(step.params)])
    report = {"processes": jax.process_count(), "devices": jax.device_count(),
              "losses": losses, "params": params.tolist()}
    print("\n" + json.dumps(report), flush=True)  # the last line (gloo logs to stdout too)
    if args.processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
