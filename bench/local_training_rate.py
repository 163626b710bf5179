"""How close local training comes to the bare step, without any framework (docs/performance.md).

``python -m bench.local_training_rate [--clients 20] [--repeats 3]``: in one process on one thread (BLAS pinned,
freed memory kept as in the app's workers), samples/s of

* the bare step — forward, backward and the app's SGD step (its kernels, :func:`clients.training.sgd_kernels`) on
  one fixed batch of 32 (the compute limit's step, bench/floors.py);
* ``clients.training.train_local`` over the first ``--clients`` clients of the P2 partition (Fashion-MNIST, M = 500,
  Dirichlet 0.6), one epoch, batch 32: real clients, with their partial last batches, a fresh gathered mini-batch
  every step and the loop's bookkeeping.

Their ratio is what any framework replaying this workload can reach at best against the compute limit.
"""

from __future__ import annotations

import argparse
import json
import os
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from clients.training import LocalTrainingConfig, sgd_kernels, train_local  # noqa: E402
from fl_app.allocator import keep_freed_memory  # noqa: E402
from fl_app.config import compose_config  # noqa: E402
from fl_app.data.datasets import load_dataset  # noqa: E402
from fl_app.data.partition import get_partition  # noqa: E402
from fl_app.models import build_model_for_dataset, to_compute_layout  # noqa: E402
from fl_app.threads import limit_library_threads  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    limit_library_threads(1)
    keep_freed_memory()
    cfg = compose_config(["dataset.num_clients=500"])
    d, c = cfg.dataset, cfg.client
    train, _ = load_dataset(d.name, d.data_dir)
    clients = []
    for pid in range(args.clients):
        rows = get_partition(d.name, d.data_dir, d.partition, d.num_clients, d.alpha, cfg.seed, pid)
        idx = torch.from_numpy(rows.copy())
        clients.append((train.x[idx], train.y[idx]))
    samples = sum(int(y.shape[0]) for _, y in clients)
    cpu = torch.device("cpu")
    model = to_compute_layout(build_model_for_dataset(cfg.model.name, d.name, seed=cfg.seed), cpu)
    opt = torch.optim.SGD(
        model.parameters(), lr=1e-3, momentum=c.momentum, weight_decay=c.weight_decay, **sgd_kernels(cpu)
    )
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 28, 28, generator=gen), torch.randint(0, 10, (32,), generator=gen)

    def bare() -> float:
        t = time.perf_counter()
        for _ in range(60):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return 60 * 32 / (time.perf_counter() - t)

    local = LocalTrainingConfig(epochs=1, batch_size=32, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    def real() -> float:
        t = time.perf_counter()
        for i, (cx, cy) in enumerate(clients):
            train_local(model, cx, cy, local, 1, torch.Generator().manual_seed(i), cpu)
        return samples / (time.perf_counter() - t)

    bare()  # warm-up
    best_bare = max(bare() for _ in range(args.repeats))
    best_real = max(real() for _ in range(args.repeats))
    result = {
        "clients": args.clients,
        "samples": samples,
        "bare_step_samples_per_s": best_bare,
        "train_local_samples_per_s": best_real,
        "train_local_over_bare": best_real / best_bare,
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
