"""A tensor-parallel worker (ranks 1..N-1): ``python -m dspine_engine.distributed.worker``.

Started by rank 0 (workers.py), never by a user. It reads its launch spec from stdin, joins the
process group, loads the target and keeps only its shard, then runs exactly the forwards rank 0
announces, on its own slice of the KV pool (the pages rank 0's cache manager assigns: the block
tables and slots come with every forward). It owns no scheduling state, so it cannot drift
from rank 0. stdin/stdout carry the control messages (protocol.py); anything the libraries
print goes to stderr. When rank 0 goes away its end of the pipe closes and the worker exits.
"""
from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Connection


def _channels() -> tuple[Connection, Connection]:
    rx = Connection(os.dup(0), writable=False)
    tx = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # stray prints must not corrupt the channel
    return rx, tx


def main() -> int:
    rx, tx = _channels()
    try:
        spec = rx.recv()
    except EOFError:
        return 1
    try:
        import torch

        torch.set_num_threads(spec["threads"])
        tx.send(("hello",))
        _run(spec, rx, tx)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        os._exit(1)  # rank 0 is gone: nobody to report to, and no group left to leave cleanly
    except BaseException:
        try:
            tx.send(("error", traceback.format_exc(limit=8)))
        except OSError:
            pass
        os._exit(1)  # the group is out of step: its teardown could wait for dead peers
    return 0


def _run(spec: dict, rx: Connection, tx: Connection) -> None:
    import torch

    from ..engine.kv_cache import KVCache
    from ..models.target import TargetModel
    from . import group
    from .protocol import receive_forward, unpack_forward
    from .sharding import shard_target

    rank, world, device = spec["rank"], spec["world"], spec["device"]
    if device.type == "cuda":
        torch.cuda.set_device(device)  # this process's GPU: the caching allocator's, NCCL's
    group.join(spec["store"], rank, world, device, spec["timeout"])
    model = shard_target(TargetModel.load(spec["target_dir"], device, spec["dtype"],
                                          progress=False), rank, world)
    kv = None
    graphs: dict[int, tuple] = {}  # rank 0's captured forwards, by id: (graph, its input buffer)
    pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
    while True:
        msg = rx.recv()  # EOFError when rank 0 is gone
        if msg[0] == "forward":
            header = msg[1]
            tokens, meta, rows = unpack_forward(header, receive_forward(header, device))
            model.forward(tokens, meta, kv.k, kv.v, logit_rows=rows)
        elif msg[0] == "capture":  # rank 0 is capturing this forward into a graph right now
            graphs[msg[1]] = _capture_forward(model, msg[2], kv, device, pool)
        elif msg[0] == "replay":
            for graph_id in msg[1]:
                graphs[graph_id][0].replay()
        elif msg[0] == "setup":
            max_position, num_pages, page_size, model.exact_attention, kv_dtype = msg[1:]
            model.cover_positions(max_position)
            cfg = model.config
            kv = KVCache(cfg.num_kv_layers, num_pages, page_size, cfg.num_kv_heads,
                         cfg.head_dim, kv_dtype, device)
            tx.send(("ready",))
        elif msg[0] == "stop":
            group.leave()
            return
        else:
            raise ValueError(f"unknown message {msg[0]!r}")


def _capture_forward(model, header, kv, device, pool) -> tuple:
    """A CUDA graph of one forward from a static input buffer: the broadcast that fills it, the
    unpacking and the sharded forward, recorded in lockstep with rank 0's capture. Returns the
    graph and the buffer (kept alive with it)."""
    import torch

    from .protocol import receive_into, unpack_forward

    flat = torch.empty(sum(header.sizes), dtype=torch.int64, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        tokens, meta, rows = unpack_forward(header, receive_into(flat))
        model.forward(tokens, meta, kv.k, kv.v, logit_rows=rows)
    return graph, flat


if __name__ == "__main__":
    sys.exit(main())
