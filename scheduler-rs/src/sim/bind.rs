//! Per-request TP binding in the simulator (issue 32): a request of a tier with `bind_tp`
//! dispatched to a group smaller than it may borrow the aligned block of groups around it.
//!
//! The decision is [`BindingModel::decide`], the very call the worker's binder makes through
//! `nitsum._core`, on a [`BindQuery`] built from the simulated block: each group's TP, decode
//! batch, mean context and the prompt tokens of its next iteration. The chosen mode is then
//! played out:
//!
//! - `dp`: the request waits on the named group, first in its class (a priority request);
//! - `prefill`: the block's groups finish their current iteration, then pause for the bound
//!   prefill (the model's estimate at TP k); the first token comes at its end and the KV goes
//!   to the named group, which decodes it (like a P/D handoff);
//! - `full`: paused for the prefill and the decode at TP k; while the block's groups have
//!   queued work the request is re-asked with `prompt_tokens: 0` (at its first token and at
//!   each arrival routed into the block), and handed back to a replica when DP is cheaper.
//!
//! NOTE: a bound request is in no group's queues while bound; its timings come from the
//! model's estimate of the chosen option (the same numbers the decision weighed), and the
//! block's groups are held by `ready_at` (chained bindings queue behind one another).

use crate::binding::{BindDecision, BindMode, BindOption, BindQuery, ReplicaLoad};
use crate::dispatch::Class;
use crate::plan::Role;

use super::bind_types::{BindPolicy, BindRecord, Binding};
use super::cluster::Cluster;
use super::event_queue::Kind;

/// Most decisions a run keeps in its report (`SimResult::bind_log`).
const LOG_LIMIT: usize = 256;

impl Cluster<'_> {
    /// Leaders of the groups in the aligned block of `k` devices around group `leader`, if a
    /// binding there is possible: every group meeting the block lies inside it, is a TP group
    /// (no pipeline) that decodes, and smaller than `k`.
    fn block_of(&self, leader: u32, k: u32) -> Option<Vec<u32>> {
        let g = self.groups.get(&leader)?;
        if k > self.cfg.devices || g.plan.devices() >= k || !self.profile.has_tp(k) {
            return None;
        }
        let lo = g.plan.members.iter().min()? / k * k;
        let inside = |d: &u32| (lo..lo + k).contains(d);
        let mut leaders = Vec::new();
        for (&l, e) in &self.groups {
            let meets = e.plan.members.iter().filter(|d| inside(d)).count();
            if meets == 0 {
                continue;
            }
            let ok = meets == e.plan.members.len()
                && e.plan.pp == 1
                && e.plan.role != Role::Prefill
                && self.profile.has_tp(e.plan.tp);
            if !ok {
                return None;
            }
            leaders.push(l);
        }
        Some(leaders)
    }

    /// The cost model's view of the block's groups, and their requests' mean output tokens
    /// and tier weight.
    fn replica_loads(&self, leaders: &[u32]) -> (Vec<ReplicaLoad>, f64, f64) {
        let (mut n, mut out, mut w) = (0.0, 0.0, 0.0);
        let loads = leaders
            .iter()
            .map(|l| {
                let g = &self.groups[l];
                for &r in g.batch() {
                    n += 1.0;
                    out += f64::from(self.reqs[r].output);
                    w += self.cfg.tiers[self.reqs[r].tier.index()].weight;
                }
                ReplicaLoad {
                    tp: g.plan.tp,
                    decoding: g.batch().len() as u32,
                    context: g.mean_context(),
                    prefill_tokens: g.next_prompt_tokens(&self.reqs),
                    // NOTE: simulated groups run exactly as profiled.
                    slowdown: 1.0,
                }
            })
            .collect();
        if n == 0.0 {
            let prior = crate::stats::DEFAULT_PRIOR_LENGTHS.1;
            return (loads, prior, 1.0);
        }
        (loads, out / n, w / n)
    }

    /// The query for request `r` (`prefilled`: only its decode is weighed) on the block.
    pub(super) fn bind_query(
        &self,
        r: usize,
        k: u32,
        leaders: &[u32],
        prefilled: bool,
    ) -> BindQuery {
        let q = &self.reqs[r];
        let tier = &self.cfg.tiers[q.tier.index()];
        let (replicas, replica_output_tokens, replica_weight) = self.replica_loads(leaders);
        BindQuery {
            level: k,
            prompt_tokens: if prefilled { 0 } else { q.input },
            output_tokens: (q.output - q.generated).max(1),
            context_tokens: if prefilled { q.input + q.generated } else { 0 },
            ttft_ms: Some(tier.ttft_ms),
            tpot_ms: Some(tier.tpot_ms),
            weight: tier.weight,
            replicas,
            token_budget: self.cfg.chunk_tokens,
            handoff_ms_per_token: self.cfg.kv_bytes_per_token / (self.cfg.kv_bandwidth_gbps * 1e6),
            bound_slowdown: 1.0,
            replica_output_tokens,
            replica_weight,
            wait_ms: (self.block_free_at(leaders) - self.now).max(0.0) * 1e3,
        }
    }

    /// When every group of the block has finished its current iteration and is out of any
    /// binding or pause (s).
    fn block_free_at(&self, leaders: &[u32]) -> f64 {
        leaders
            .iter()
            .filter_map(|l| self.groups.get(l))
            .map(|g| g.ready_at.max(if g.busy() { g.busy_until } else { 0.0 }))
            .fold(self.now, f64::max)
    }

    /// Ask the model about `query`; `None` when it cannot answer (it is then served in DP).
    pub(super) fn decide(&mut self, r: usize, query: BindQuery) -> Option<BindDecision> {
        let mut decision = self.binder.decide(&query).ok()?;
        if self.cfg.binding == BindPolicy::Always && query.prompt_tokens > 0 {
            decision.mode = BindMode::Full;
        }
        if self.cfg.records && self.bind_log.len() < LOG_LIMIT {
            self.bind_log.push(BindRecord {
                id: r,
                t_s: self.now,
                query,
                decision: decision.clone(),
            });
        }
        Some(decision)
    }

    /// Try to bind request `r`, just dispatched to group `leader` in `class`; false: it is
    /// not bound and goes to its group as usual.
    pub(super) fn try_bind(&mut self, r: usize, leader: u32, class: Class) -> bool {
        let tier = &self.cfg.tiers[self.reqs[r].tier.index()];
        let Some(k) = tier.bind_tp else {
            return false;
        };
        if self.cfg.binding == BindPolicy::Off || class == Class::Background {
            return false;
        }
        let Some(leaders) = self.block_of(leader, k) else {
            return false;
        };
        let query = self.bind_query(r, k, &leaders, false);
        let Some(decision) = self.decide(r, query) else {
            return false;
        };
        let option = |m: BindMode| decision.options.iter().find(|o| o.mode == m).cloned();
        let replica = leaders[decision.replica];
        match (decision.mode, option(decision.mode)) {
            (BindMode::Dp, _) | (_, None) => {
                self.bind_counts.dp += 1;
                let g = self.groups.get_mut(&replica).expect("in the block");
                g.push_prefill_front(r, class);
                self.kick(replica);
            }
            (mode, Some(o)) => {
                if mode == BindMode::Full {
                    self.bind_counts.full += 1;
                } else {
                    self.bind_counts.prefill += 1;
                }
                self.reqs[r].decode_leader = Some(replica);
                self.start_binding(r, mode, &o, leaders, replica);
            }
        }
        true
    }

    /// Hold the block from when its groups finish their current iteration (and any binding
    /// before this one) for option `o` of request `r`.
    fn start_binding(
        &mut self,
        r: usize,
        mode: BindMode,
        o: &BindOption,
        leaders: Vec<u32>,
        replica: u32,
    ) {
        // NOTE: the option's TTFT counts from now: it includes the wait for the block
        // (`BindQuery::wait_ms`), and for `prefill` the KV's trip back to the replica.
        let input = self.reqs[r].input;
        let handoff_s = self.transfer_s(f64::from(input) * self.cfg.kv_bytes_per_token);
        let first = match mode {
            BindMode::Prefill => self.now + (o.ttft_ms / 1e3 - handoff_s).max(0.0),
            _ => self.now + o.ttft_ms / 1e3,
        };
        let decode_s = o.tpot_ms / 1e3 * f64::from(self.reqs[r].output.saturating_sub(1));
        let end = match mode {
            BindMode::Full => first + decode_s,
            _ => first,
        };
        for l in &leaders {
            let g = self.groups.get_mut(l).expect("in the block");
            g.ready_at = g.ready_at.max(end);
        }
        self.next_binding += 1;
        let id = self.next_binding;
        self.bindings.push(Binding {
            id,
            req: r,
            mode,
            leaders,
            replica,
            first,
            end,
            tpot_ms: o.tpot_ms,
            handoff_s,
        });
        self.push(first, Kind::BoundFirst(r, id));
        if mode == BindMode::Full {
            self.push(end, Kind::BoundDone(r, id));
        }
    }
}

#[cfg(test)]
#[path = "bind_tests.rs"]
mod tests;
