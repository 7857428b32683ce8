"""n > 1 choices of one prompt share its prefill: the router sends each sibling choice with
`fork_of` naming the first choice's request; a sibling waits (not admitted) until that
request's prompt is computed, which then shares its full prompt pages through the prefix
cache (`KVSpace.publish`), so the sibling matches them and computes only the prompt's last
partial page (at least its last token, whose logits it samples from).

NOTE: sharing is an optimisation, never a dependency: a sibling whose first choice is not
in this engine (another group, already gone) or has another prompt runs on its own, and one
whose first choice ends, moves away or is aborted before sharing stops waiting.
"""

from __future__ import annotations

from nitsum.engine.kv_space import KVSpace
from nitsum.engine.sequence import Sequence


class Forks:
    """The sibling choices waiting for a first choice's prefill, by its request id."""

    def __init__(self, kv: KVSpace) -> None:
        self.kv = kv
        self.waiting: dict[str, list[Sequence]] = {}

    def join(self, child: Sequence, parent: Sequence | None) -> None:
        """`child` is a sibling choice of `parent` (None: not in this engine)."""
        if parent is None or parent.prompt_ids != child.prompt_ids or self.kv.cache is None:
            return
        if parent.num_computed >= len(parent.prompt_ids):
            self.kv.publish(parent)  # already prefilled: share now, no wait
            return
        child.waits_for = parent.request_id
        self.waiting.setdefault(parent.request_id, []).append(child)

    def computed(self, seq: Sequence) -> None:
        """After a step that computed some of `seq`: share its prompt once it is complete."""
        if seq.request_id in self.waiting and seq.num_computed >= len(seq.prompt_ids):
            self.kv.publish(seq)
            self.release(seq.request_id)

    def release(self, request_id: str) -> None:
        """`request_id` will not share (it ended or left): its siblings stop waiting."""
        for child in self.waiting.pop(request_id, []):
            child.waits_for = None
