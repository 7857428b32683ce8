"""`nitsum bench`: trace-replay load generator and goodput reports.

Pipeline, one module per step:

- `traces` (Azure CSV, JSONL) and `bursty` (synthetic low/high Poisson) produce
  `TraceRequest`s; `transform` windows, rate-scales, length-scales/clamps and caps them;
  `tiers` gives each a tier (mix ratio or prompt-length rule) from a tiers spec;
  `mixes` gives tiers by a mix that changes over the run (step, sine) and `sources` takes
  each tier from its own trace (`timepoint` parses their `0.5` / `1800s` times);
  `workload` fixes the order of those steps. `random_dataset` makes `vllm bench serve`'s
  random requests (fixed lengths, all at t = 0) and `closed_loop` runs them at a fixed
  concurrency, one run per value.
- `replay` sends them on time to an OpenAI-compatible `/v1/completions` (streaming) and
  records a `record.RequestRecord` per request; `planlog` polls the router's `/admin/plan`.
- `report` turns records into goodput, per-tier SLO attainment and latency percentiles;
  `plot` draws goodput vs rate and the plan timeline; `sweep` runs a sweep (rate scales or
  concurrencies) run by run; `cli` is `nitsum bench`.
- `fake_server` is a streaming stand-in with known delays for tests and demos.

Goodput counts requests that completed and met both their tier's TTFT and TPOT, per second
of trace duration; background tiers count toward completion only (see `report`).
"""
