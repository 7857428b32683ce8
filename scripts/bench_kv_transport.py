"""KV handoff between two host worker processes: NIXL against the gloo path, same pages.

Two processes (a sender and a receiver), each with one device's KV storage of a Llama-3-8B
shape (32 layers, 8 KV heads of 128, bf16, pages of 16 tokens) and the production code of
each path (pool/remote_handoff.py's steps without an engine):
- gloo: `export_kv` (pack the pages into the wire tensor), `KVPeers.send`, the receiver's
  arrival and `import_kv` (unpack into its pages);
- NIXL: `NixlPeers.offer`, the receiver's `pull` (plan the pieces, READ them device to
  device) and its commit (`took`).
Each handoff moves the same sequence from the same pages to the same pages. The clock runs
from the sender's first call to the receiver's last (one machine: one monotonic clock).

    .venv/bin/python scripts/bench_kv_transport.py                 # UCX's choice, then TCP
    .venv/bin/python scripts/bench_kv_transport.py --tls tcp --tokens 2048 --reps 5

`--tls`: UCX transports for NIXL (UCX_TLS): `default` lets UCX choose (cross-memory attach
between processes of one machine), `tcp` forces TCP as between machines without RDMA; gloo
runs over loopback TCP in both.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}


class BenchDevice:
    """One device's KV storage with the device side of both paths (what LocalDevice does
    for kv_out / kv_in / nixl_*), without a model."""

    num_devices = 1

    def __init__(self, storage: Any, cfg: Any) -> None:
        from nitsum.pool.kv_transfer import KVTransfer

        self.transfer = KVTransfer(storage, cfg.num_kv_heads, cfg.head_dim, 0, chunk_bytes=0)
        self.nixl: Any = None

    def kv_out(self, pieces: list[Any]) -> list[Any]:
        from nitsum.pool.kv_wire import pack_pieces

        return pack_pieces(self.transfer, pieces)

    def kv_in(self, pieces: list[Any], blocks: list[Any]) -> None:
        from nitsum.pool.kv_wire import unpack_pieces

        unpack_pieces(self.transfer, pieces, blocks)

    def nixl_open(self) -> list[Any]:
        from nitsum.pool.nixl_endpoint import KVEndpoint

        self.nixl = self.nixl or KVEndpoint.of(self.transfer)
        return [self.nixl.info()]

    def nixl_connect(self, metadata: list[bytes]) -> None:
        self.nixl.connect(metadata)

    def nixl_read(self, reads: dict[int, list[Any]], timeout_s: float) -> int:
        return int(self.nixl.read(reads.get(0, []), timeout_s))


def side(rank: int, port: int, args: argparse.Namespace, q: Any, barrier: Any) -> None:
    import torch

    from nitsum.config import ModelConfig
    from nitsum.parallel.topology import GroupShape
    from nitsum.pool.kv_rendezvous import join_nixl, nixl_record
    from nitsum.pool.kv_wire import export_kv, import_kv
    from nitsum.pool.migration_plan import Placement
    from nitsum.pool.peers import KVPeers, rendezvous

    torch.set_num_threads(1)
    cfg = ModelConfig.from_hf(LLAMA_8B)
    pt, tokens = args.page_tokens, args.tokens
    pages = args.tokens // pt * 2 + 1
    elems = pt * cfg.num_kv_heads * cfg.head_dim
    g = torch.Generator().manual_seed(rank)
    storage = torch.randn(cfg.num_layers, 2, pages + 1, elems, generator=g).to(torch.bfloat16)
    dev = BenchDevice(storage, cfg)
    # The sequence's pages: shuffled, as a pool hands them out after a while.
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(7 + rank)).tolist()
    mine = Placement(GroupShape((0,)), tuple(order[: -(-tokens // pt)]))
    store = rendezvous(f"tcp://127.0.0.1:{port}", rank, 2, 60)
    gloo = KVPeers(store, rank, 2, [rank], timeout_s=60, rendezvous_s=60)
    host, rec = nixl_record(dev, [rank])  # type: ignore[arg-type]
    store.set(f"rec/{rank}", json.dumps(rec | {"ids": [rank]}))
    records = [json.loads(store.get(f"rec/{r}")) for r in range(2)]
    nixl = join_nixl(records, rank, host, dev, [rank], timeout_s=60)  # type: ignore[arg-type]
    seq = list(mine.pages)
    if rank == 0:
        q.put(("want", 0, "sum", float(storage[:, :, seq].float().sum())))
    for rep in range(args.reps + 1):  # the first of each: warm-up (connections)
        for path in ("gloo", "nixl"):
            if rank == 1:
                storage[:, :, seq] = 0  # so the check below sees this very move
            barrier.wait()
            if rank == 0:
                t0 = time.monotonic()
                if path == "gloo":
                    kv = export_kv(dev, cfg, pt, tokens, mine)  # type: ignore[arg-type]
                    gloo.send(1, {"request_id": "r", "target": 1}, kv)
                else:
                    nixl.offer(1, {"request_id": "r", "target": 1}, mine, tokens)
                    while not nixl.poll().taken:
                        time.sleep(0.0002)
                q.put((path, rep, "t0", t0))
            else:
                if path == "gloo":
                    while not (got := gloo.arrivals()):
                        time.sleep(0.0002)
                    import_kv(dev, cfg, pt, got[0][1], mine)  # type: ignore[arg-type]
                else:
                    while not (offers := nixl.poll().offers):
                        time.sleep(0.0002)
                    nixl.pull(offers[0], mine, cfg, pt)
                    nixl.took(offers[0])
                q.put((path, rep, "t1", time.monotonic()))
                q.put((path, rep, "sum", float(storage[:, :, seq].float().sum())))
            barrier.wait()
    host.close()
    dev.nixl.agent.close()
    time.sleep(0.3)
    os._exit(0)  # NOTE: gloo's receiver thread cannot be joined (pool/peers.py)


def measure(args: argparse.Namespace, tls: str) -> dict[str, float]:
    from nitsum.ports import free_port

    if tls != "default":
        os.environ["UCX_TLS"] = tls
    else:
        os.environ.pop("UCX_TLS", None)
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    port = free_port()
    procs = [ctx.Process(target=side, args=(r, port, args, q, barrier)) for r in (0, 1)]
    for p in procs:
        p.start()
    marks: dict[tuple[str, int], dict[str, float]] = {}
    for _ in range(1 + (args.reps + 1) * 2 * 3):
        path, rep, key, value = q.get(timeout=600)
        marks.setdefault((path, rep), {})[key] = value
    for p in procs:
        p.join(30)
    want = marks[("want", 0)]["sum"]
    bad = [k for k, m in marks.items() if "sum" in m and k[0] != "want" and m["sum"] != want]
    if bad:
        raise SystemExit(f"the KV moved by {bad} differs from the sender's")
    nbytes = 32 * 2 * args.tokens * 8 * 128 * 2
    out = {}
    for path in ("gloo", "nixl"):
        secs = [marks[(path, r)]["t1"] - marks[(path, r)]["t0"] for r in range(1, args.reps + 1)]
        out[path] = nbytes / statistics.median(secs) / 1e9
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--page-tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tls", default="default,tcp", help="UCX_TLS values to run, comma-separated")
    args = p.parse_args()
    mib = 32 * 2 * args.tokens * 8 * 128 * 2 / 2**20
    print(f"handoff of {args.tokens} tokens = {mib:.0f} MiB of KV (Llama-3-8B shape, bf16), "
          f"pages of {args.page_tokens}, median of {args.reps}")  # fmt: skip
    for tls in args.tls.split(","):
        r = measure(args, tls)
        print(
            f"UCX_TLS={tls:8s} gloo {r['gloo']:.2f} GB/s   nixl {r['nixl']:.2f} GB/s   "
            f"nixl/gloo {r['nixl'] / r['gloo']:.2f}x"
        )


if __name__ == "__main__":
    main()
