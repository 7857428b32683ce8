//! Applying a new plan in the simulator: unchanged groups keep their state, new groups pause
//! for the TP switch, dissolved groups' requests are re-dispatched (waiting) or migrate their
//! KV (decoding, stop-and-migrate).

use std::collections::BTreeMap;

use crate::dispatch::DispatchRequest;
use crate::plan::Role;
use crate::planner::{Planned, PlannerConfig};

use super::cluster::Cluster;
use super::group::GroupSim;

impl Cluster<'_> {
    /// Switch to a new plan: keep unchanged groups, dissolve the rest, re-home their requests.
    pub(super) fn apply(&mut self, planned: Planned, pay: bool) {
        let mut old = std::mem::take(&mut self.groups);
        let mut orphans_pre = Vec::new();
        let mut orphans_dec = Vec::new();
        let mut changed = false;
        for (g, cap) in planned.plan.groups.iter().zip(&planned.batch_caps) {
            let l = g.leader();
            let cap = if *cap > 0.0 {
                *cap
            } else {
                self.profile.max_batch(g.shape())
            };
            let budget = match g.role {
                Role::Prefill => self.cfg.prefill_budget_tokens,
                _ => self.cfg.chunk_tokens,
            };
            // NOTE: the same devices in another shape (TP <-> pipeline) move their KV.
            let same = |e: &GroupSim| e.plan.members == g.members && e.plan.shape() == g.shape();
            let keep = old
                .get(&l)
                .is_some_and(|e| same(e) && e.plan.role == g.role);
            let engine = if keep {
                let mut e = old.remove(&l).expect("checked");
                e.plan = g.clone();
                e.batch_cap = cap as usize;
                e
            } else {
                changed = true;
                let same_devices = old.get(&l).is_some_and(same);
                let pause = if pay && !same_devices {
                    self.moved += u64::from(g.devices());
                    self.cfg.switch_ms / 1000.0
                } else {
                    0.0
                };
                self.next_gen += 1;
                GroupSim::new(
                    g.clone(),
                    cap as usize,
                    budget,
                    self.now + pause,
                    self.next_gen,
                )
            };
            let mut engine = engine;
            engine.demote_late = self.demotes_late();
            // SLO groups keep lower-class work within their tier's iteration target: TPOT for
            // decoding groups, the planner's prefill batch bound for prefill-only groups.
            let slo_group = g.max_inflight > 0.0 && g.max_inflight.is_finite();
            let mine = g.tiers.iter().map(|id| &self.cfg.tiers[id.index()]);
            engine.iter_limit_ms = match (slo_group, g.role) {
                (false, _) => f64::INFINITY,
                (true, Role::Prefill) => mine
                    .map(|t| t.ttft_ms * PlannerConfig::default().prefill_slack)
                    .fold(f64::INFINITY, f64::min),
                (true, _) => mine.map(|t| t.tpot_ms).fold(f64::INFINITY, f64::min),
            };
            self.groups.insert(l, engine);
        }
        for (l, mut e) in old {
            let (pre, dec) = e.drain(&mut self.reqs);
            orphans_pre.extend(pre);
            orphans_dec.extend(dec.into_iter().map(|r| (r, l)));
        }
        self.plan = planned.plan;
        self.dispatcher.set_plan(&self.plan);
        if changed && pay {
            self.reconfigs += 1;
        }
        let layout: Vec<String> = self
            .plan
            .groups
            .iter()
            .map(|g| g.summary(&self.cfg.tiers))
            .collect();
        let layout = layout.join(" ");
        if self.timeline.last().is_none_or(|(_, last)| *last != layout) {
            self.timeline.push((self.now, layout));
        }
        // Waiting requests move as metadata; partially prefilled KV moves with them.
        for r in orphans_pre {
            let tier = &self.cfg.tiers[self.reqs[r].tier.index()];
            let req = DispatchRequest {
                tier: self.reqs[r].tier,
                background: tier.background,
                affinity: None,
            };
            match self.dispatcher.dispatch(r as u64, &req) {
                Some(d) => {
                    self.reqs[r].class = d.class;
                    self.reqs[r].decode_leader = d.decode_leader;
                    let g = self.groups.get_mut(&d.prefill_leader).expect("planned");
                    g.push_prefill(r, d.class);
                }
                None => self.drop_request(r),
            }
        }
        // Decoding requests migrate their KV (stop-and-migrate): each target pauses for the
        // switch plus all the bytes it receives (one aggregated, pipelined transfer).
        let mut inbound: BTreeMap<u32, (f64, Vec<usize>)> = BTreeMap::new();
        for (r, from) in orphans_dec {
            match self.decode_target(Some(from), Some(from)) {
                Some(l) => {
                    let ctx = f64::from(self.reqs[r].input + self.reqs[r].generated);
                    let e = inbound.entry(l).or_default();
                    e.0 += ctx * self.cfg.kv_bytes_per_token;
                    e.1.push(r);
                }
                None => self.drop_request(r),
            }
        }
        for (l, (bytes, rs)) in inbound {
            let pause = self.transfer_s(bytes) + self.cfg.switch_ms / 1000.0;
            for r in rs {
                self.hand_to_decoder(r, Some(l), pause);
            }
        }
        let leaders: Vec<u32> = self.groups.keys().copied().collect();
        for l in leaders {
            self.kick(l);
        }
    }
}
