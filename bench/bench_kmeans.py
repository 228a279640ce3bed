"""Spherical K-Means backends side by side: seconds and quality on clustered synthetic states.

States are a mixture of random unit directions plus Gaussian noise (default 100,000 x 1024, 2,048 directions), the
size of the paper's memory bank (M = 100,000) for a RoBERTa-large layer. For every cluster count and every backend
available here (torch on CPU, torch on CUDA, faiss-cpu, faiss-gpu) it runs one cold fit (greedy k-means++ start,
then Lloyd) and reports wall-clock seconds, the mean cosine of each state to its assigned centroid and the balance
of the cluster sizes. Backends share the k-means++ start, so equal quality columns mean equal Lloyd results.

    python bench/bench_kmeans.py                      # full size
    python bench/bench_kmeans.py --n 5000 --dim 64    # quick smoke run
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from hf_clusterformer.kmeans import available_backends, spherical_kmeans


def clustered_states(n: int, dim: int, directions: int, noise: float, seed: int) -> torch.Tensor:
    """(n, dim) float32 states: random unit directions plus isotropic noise of total norm ``noise``."""
    generator = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(directions, dim, generator=generator), dim=1)
    which = torch.randint(directions, (n,), generator=generator)
    return centres[which] + noise / dim**0.5 * torch.randn(n, dim, generator=generator)


def runs(devices: list[str]) -> list[tuple[str, str]]:
    """(backend, device) pairs to benchmark."""
    pairs = []
    for device in devices:
        for backend in available_backends(device):
            if backend == "faiss-cpu" and device != "cpu":
                continue
            pairs.append((backend, device))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="number of states")
    parser.add_argument("--dim", type=int, default=1024, help="state width")
    parser.add_argument("--clusters", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--directions", type=int, default=2048, help="mixture components of the synthetic states")
    parser.add_argument("--noise", type=float, default=1.0, help="noise norm relative to the unit directions")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-points-per-centroid", type=int, default=None,
        help="fit on at most k * this many states (faiss' default is 256)",
    )
    parser.add_argument("--backends", nargs="+", default=None, help="subset of torch, faiss-cpu, faiss-gpu")
    args = parser.parse_args()

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    pairs = [p for p in runs(devices) if args.backends is None or p[0] in args.backends]
    cpu_states = clustered_states(args.n, args.dim, args.directions, args.noise, args.seed)
    print(f"{args.n} x {args.dim} states, {args.iters} iterations, torch threads: {torch.get_num_threads()}")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    header = (f"{'k':>5} {'backend':>10} {'device':>7} {'seconds':>9} {'mean cos':>9} {'min/max size':>14} "
              f"{'norm. entropy':>14}")
    print(header)
    print("-" * len(header))
    for k in args.clusters:
        for backend, device in pairs:
            states = cpu_states.to(device)
            # Warm-up (CUDA context, kernels, faiss import) on a small slice, not timed.
            spherical_kmeans(states[: 4 * k], k, num_iters=2, backend=backend, seed=args.seed)
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = spherical_kmeans(
                states,
                k,
                num_iters=args.iters,
                backend=backend,
                seed=args.seed,
                max_points_per_centroid=args.max_points_per_centroid,
            )
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            s = result.stats
            sizes = f"{s.size_min}/{s.size_max}"
            print(
                f"{k:>5} {backend:>10} {device:>7} {seconds:>9.3f} {s.mean_cosine:>9.4f} {sizes:>14} "
                f"{s.normalized_entropy:>14.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
