"""The live requests' token streams: engine outputs become `tokens` messages to the router.

After each step the server hands the backend's outputs here: every request gets one `tokens`
message per step (whatever the engine yielded for it), on the socket its `generate` arrived
on (that router's link of that device), and a final one, with its finish reason, when it
ends. Requests the backend handed to another process (P/D across hosts) leave the streams;
ones handed to us join them.
"""

from __future__ import annotations

import logging

from nitsum.engine.request_output import RequestOutput
from nitsum.sampling_logprobs import TokenLogprob
from nitsum.worker import protocol as proto
from nitsum.worker.backend import Backend
from nitsum.worker.link import LinkKey, RouterLink

log = logging.getLogger(__name__)


class TokenStreams:
    """The accepted requests of `backend` (`live`) and their `tokens` messages on `links`.

    NOTE: `final` sends a request's last message and forgets it: every accepted `generate`
    ends in exactly one final `tokens` (worker/server.py).
    """

    def __init__(self, backend: Backend, links: dict[LinkKey, RouterLink]) -> None:
        self.backend = backend
        self.links = links  # NOTE: the server's dict, filled when it connects
        # request id -> ((router, device) it came on, prompt tokens)
        self.live: dict[str, tuple[LinkKey, int]] = {}

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """Send what one step produced: one message per request, a final one for those that
        finished."""
        left, came = self.backend.moved()
        for rid in left:  # handed to another process, which ends it: no final from here
            self.live.pop(rid, None)
        for rid, device, prompt_tokens in came:  # streams on the decode target's socket
            # NOTE: KV peers serve one router (worker/__main__.py refuses more).
            self.live[rid] = ((0, device), prompt_tokens)
        new: dict[str, list[int]] = {}
        reasons: dict[str, str] = {}
        errors: dict[str, str] = {}
        queued: dict[str, float] = {}
        logprobs: dict[str, list[TokenLogprob]] = {}
        prompt_lps: dict[str, list[TokenLogprob]] = {}
        cached: dict[str, int] = {}
        for out in outputs:  # one message per request per step, whatever the engine yields
            new.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.queue_s is not None:
                queued[out.request_id] = out.queue_s * 1e3
            if out.logprobs is not None:
                logprobs.setdefault(out.request_id, []).extend(out.logprobs)
            if out.prompt_logprobs is not None:
                prompt_lps[out.request_id] = out.prompt_logprobs
            if out.cached_tokens is not None:
                cached[out.request_id] = out.cached_tokens
            if out.finish_reason is not None:
                reasons[out.request_id] = out.finish_reason
            if out.error is not None:
                errors[out.request_id] = out.error
        for rid, ids in new.items():
            if rid not in self.live:
                log.error("engine produced tokens for unknown request %r", rid)
            elif rid in reasons:
                failed = errors.get(rid, "the engine failed this request (see the worker log)")
                error = failed if reasons[rid] == "error" else None
                self.final(
                    rid,
                    ids,
                    reasons[rid],
                    error,
                    queued.get(rid),
                    logprobs.get(rid),
                    prompt_logprobs=prompt_lps.get(rid),
                    cached_tokens=cached.get(rid),
                )
            else:
                key, prompt_tokens = self.live[rid]
                msg = proto.Tokens(
                    key[1],
                    rid,
                    ids,
                    None,
                    None,
                    prompt_tokens,
                    queue_ms=queued.get(rid),
                    logprobs=logprobs.get(rid),
                    prompt_logprobs=prompt_lps.get(rid),
                    cached_tokens=cached.get(rid),
                )
                self.links[key].send(msg)

    def fail(self, rid: str, error: str) -> None:
        """End one request with an error."""
        self.backend.abort(rid)
        if rid in self.live:
            self.final(rid, [], "error", error)

    def fail_all(self, error: str) -> None:
        """End every live request with an error."""
        for rid in list(self.live):
            self.fail(rid, error)

    def final(
        self,
        rid: str,
        ids: list[int],
        reason: str,
        error: str | None,
        queue_ms: float | None = None,
        logprobs: list[TokenLogprob] | None = None,
        error_param: str | None = None,
        prompt_logprobs: list[TokenLogprob] | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """Send request `rid`'s last message (finish `reason`, `error` for "error") and
        forget it."""
        key, prompt_tokens = self.live.pop(rid)
        msg = proto.Tokens(
            key[1],
            rid,
            ids,
            reason,  # type: ignore[arg-type]
            error,
            prompt_tokens,
            queue_ms=queue_ms,
            logprobs=logprobs,
            error_param=error_param,
            prompt_logprobs=prompt_logprobs,
            cached_tokens=cached_tokens,
        )
        self.links[key].send(msg)
