"""Which KV transport the host worker processes take (pool/kv_rendezvous.py): NIXL when every
process has it, gloo when one asks for it or cannot load NIXL (the reason named), and a
refusal when one asks for NIXL that another cannot have; a process without NIXL joins over
gloo and says why."""

from __future__ import annotations

import logging

import pytest

from nitsum.pool.kv_rendezvous import choose_backend, open_kv_transport
from nitsum.pool.nixl_agent import NixlUnavailable
from nitsum.pool.peers import KVPeers
from nitsum.ports import free_port

NIXL = {"backend": "auto", "host": "nitsum-host-a-1-0"}
NO_NIXL = {"backend": "auto", "why": "cannot import NIXL (nixl_cu13._api: ImportError: x)"}


def test_every_process_with_nixl_takes_nixl() -> None:
    assert choose_backend([NIXL, NIXL | {"backend": "nixl"}]) == ("nixl", "")


def test_a_process_without_nixl_makes_every_process_fall_back_to_gloo_naming_why() -> None:
    choice, why = choose_backend([NIXL, NO_NIXL])
    assert choice == "gloo"
    assert why == "NIXL unavailable on rank 1: cannot import NIXL (nixl_cu13._api: ImportError: x)"


def test_gloo_asked_by_one_process_is_gloo_for_all() -> None:
    assert choose_backend([{"backend": "gloo"}, {"backend": "gloo"}]) == ("gloo", "")
    assert choose_backend([NIXL, {"backend": "gloo"}]) == ("gloo", "rank 1 asked for gloo")


def test_nixl_asked_for_where_a_process_cannot_have_it_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"--kv-backend nixl \(rank 0\): NIXL unavailable on rank 1"
    ):
        choose_backend([NIXL | {"backend": "nixl"}, NO_NIXL])
    with pytest.raises(ValueError, match="rank 1 asked for gloo"):
        choose_backend([NIXL | {"backend": "nixl"}, {"backend": "gloo"}])


class NoNixlPool:
    """A device pool whose devices cannot start a NIXL agent (as without the wheel)."""

    def nixl_open(self) -> list:
        raise NixlUnavailable("cannot import NIXL (test)")


def test_a_process_that_cannot_load_nixl_joins_over_gloo_with_a_warning_naming_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    addr = f"tcp://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING):
        peers = open_kv_transport(addr, 0, 1, NoNixlPool(), [0], "auto", rendezvous_s=10)  # type: ignore[arg-type]
    assert isinstance(peers, KVPeers)
    assert (
        "KV transport over gloo, not NIXL: NIXL unavailable on rank 0: cannot import NIXL (test)"
        in caplog.text
    )
    with pytest.raises(ValueError, match="--kv-backend nixl"):
        open_kv_transport(
            f"tcp://127.0.0.1:{free_port()}", 0, 1, NoNixlPool(), [0], "nixl", rendezvous_s=10
        )  # type: ignore[arg-type]
