"""How many elements a lane of the walk's top-K pass inserts into its list, with and without the
warp floor (csrc/cuda/transition.cuh, thread_top_list): a model of the kernel's loop in Python
(256 threads, 8-element groups strided over the block, the floor = the K-th largest of the 32
lanes' list heads, refreshed after each of the first four groups, then every four).

The insertion is a divergent shift of the whole list, so inserts per lane are the pass's cost
beyond reading the row. Random normal logits; prints the mean per lane for each configuration.
Run: python benchmarks/walk_floor_model.py [--vocab 151936] [--top-k 8 16]
"""
import argparse
import bisect
import math

import numpy as np

THREADS, GROUP, WARP, BATCH = 256, 8, 32, 4


def inserts_per_lane(row: np.ndarray, top_k: int, floor: bool) -> float:
    vocab, groups = len(row), math.ceil(len(row) / GROUP)
    lists = [[] for _ in range(THREADS)]  # each ascending by (-value, id): the head first
    floors = [-math.inf] * (THREADS // WARP)
    inserts, step = 0, 0
    for first in range(0, groups, THREADS):  # one group per thread: a step of the loop
        for t in range(THREADS):
            g = first + t
            for i in range(g * GROUP, min(vocab, g * GROUP + GROUP)):
                x = float(row[i])
                lst = lists[t]
                if not x >= floors[t // WARP]:
                    continue
                if len(lst) == top_k and (-x, i) >= lst[-1]:
                    continue
                inserts += 1
                bisect.insort(lst, (-x, i))
                del lst[top_k:]
        step += 1
        if floor and (step <= BATCH or step % BATCH == 0):
            for w in range(THREADS // WARP):
                heads = sorted((-lists[t][0][0] if lists[t] else -math.inf
                                for t in range(w * WARP, (w + 1) * WARP)), reverse=True)
                floors[w] = heads[top_k - 1]
    return inserts / THREADS


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--top-k", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    row = np.random.default_rng(a.seed).standard_normal(a.vocab).astype(np.float32)
    per_lane = math.ceil(a.vocab / THREADS)
    for k in a.top_k:
        without, with_floor = inserts_per_lane(row, k, False), inserts_per_lane(row, k, True)
        print(f"V={a.vocab} K={k}: ~{per_lane} elements a lane; inserts a lane "
              f"{without:.1f} without the floor, {with_floor:.1f} with it")


if __name__ == "__main__":
    main()
