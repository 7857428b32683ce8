//! The life of a binding after its decision (`bind.rs`): the first token, the end, the
//! block's release, and the hand-back of a full binding to a replica when the cost model,
//! re-asked with `prompt_tokens: 0` while the block has queued work, finds DP cheaper.

use crate::binding::BindMode;

use super::bind_types::BindPolicy;
use super::cluster::Cluster;
use super::event_queue::Kind;

impl Cluster<'_> {
    fn binding(&self, id: u64) -> Option<usize> {
        self.bindings.iter().position(|b| b.id == id)
    }

    /// The bound request's first token.
    pub(super) fn on_bound_first(&mut self, r: usize, id: u64) {
        let Some(i) = self.binding(id) else {
            return;
        };
        let q = &mut self.reqs[r];
        q.prefilled = q.input;
        q.first_token = Some(self.now);
        q.generated = 1;
        let one_token = q.output <= 1;
        let b = self.bindings[i].clone();
        if b.mode == BindMode::Prefill {
            self.bindings.remove(i);
            self.release(&b.leaders);
            if one_token {
                self.reqs[r].finish = Some(self.now);
                self.done(r);
            } else {
                self.push(self.now + b.handoff_s, Kind::KvArrived(r, b.replica));
            }
            return;
        }
        self.reconsider(i);
    }

    /// The last token of a full binding not handed back.
    pub(super) fn on_bound_done(&mut self, r: usize, id: u64) {
        let Some(i) = self.binding(id) else {
            return;
        };
        let b = self.bindings.remove(i);
        let q = &mut self.reqs[r];
        q.generated = q.output;
        q.finish = Some(self.now);
        self.done(r);
        self.release(&b.leaders);
    }

    /// Full bindings in their decode on a block holding `leader`: re-ask them (work was
    /// just queued there).
    pub(super) fn reconsider_block_of(&mut self, leader: u32) {
        let ids: Vec<u64> = self
            .bindings
            .iter()
            .filter(|b| b.mode == BindMode::Full && b.first <= self.now)
            .filter(|b| b.leaders.contains(&leader))
            .map(|b| b.id)
            .collect();
        for id in ids {
            if let Some(i) = self.binding(id) {
                self.reconsider(i);
            }
        }
    }

    /// Re-ask full binding `i` (past its first token) with `prompt_tokens: 0` if its block's
    /// groups have queued work, and hand it back to a replica when DP is cheaper.
    fn reconsider(&mut self, i: usize) {
        let b = self.bindings[i].clone();
        // NOTE: a re-plan may have dissolved the block's groups: the binding then runs out.
        if b.leaders.iter().any(|l| !self.groups.contains_key(l)) {
            return;
        }
        let queued = b.leaders.iter().any(|l| self.groups[l].load() > 0);
        if !queued {
            return;
        }
        if self.cfg.binding == BindPolicy::Always {
            return; // forced binding holds the block to the end, as Flying Serving did
        }
        let r = b.req;
        self.sync_bound();
        if self.reqs[r].generated >= self.reqs[r].output {
            return;
        }
        let query = self.bind_query(r, self.bind_level(r), &b.leaders, true);
        let Some(decision) = self.decide(r, query) else {
            return;
        };
        if decision.mode == BindMode::Full {
            return;
        }
        self.bindings.remove(i);
        self.bind_counts.handbacks += 1;
        let to = b.leaders[decision.replica];
        let q = &self.reqs[r];
        let bytes = f64::from(q.input + q.generated) * self.cfg.kv_bytes_per_token;
        self.push(self.now + self.transfer_s(bytes), Kind::KvArrived(r, to));
        self.release(&b.leaders);
    }

    fn bind_level(&self, r: usize) -> u32 {
        let tier = &self.cfg.tiers[self.reqs[r].tier.index()];
        tier.bind_tp.unwrap_or(1)
    }

    /// The block's groups are free of a binding that ended early: they resume now, unless
    /// another binding still holds them.
    fn release(&mut self, leaders: &[u32]) {
        for &l in leaders {
            let held = self
                .bindings
                .iter()
                .filter(|b| b.leaders.contains(&l))
                .map(|b| b.end)
                .fold(self.now, f64::max);
            if let Some(g) = self.groups.get_mut(&l) {
                g.ready_at = held.max(self.now).min(g.ready_at.max(self.now));
            }
            self.kick(l);
        }
    }

    /// Bring the token counts of the fully bound requests up to `now`.
    pub(super) fn sync_bound(&mut self) {
        for b in &self.bindings {
            if b.mode != BindMode::Full || b.first > self.now {
                continue;
            }
            let q = &mut self.reqs[b.req];
            let steps = ((self.now - b.first) * 1e3 / b.tpot_ms.max(1e-9)).floor();
            q.generated = (1.0 + steps).min(f64::from(q.output)) as u32;
        }
    }
}
