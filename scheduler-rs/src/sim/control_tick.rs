//! The control tick of live policies, every window: the in-flight snapshot and demand,
//! the adaptive policy's selection round, and a re-plan of the strategy in force.

use crate::dispatch::Class;
use crate::planner;
use crate::planner::strategy::plan_strategy;

use super::cluster::Cluster;
use super::event_queue::Kind;
use super::forecast::{recent_of, InFlight};
use super::lookahead::{EngineKnobs, Situation};
use super::report;
use super::reqs::Reqs;

impl Cluster<'_> {
    pub(super) fn on_control(&mut self) {
        let pc = self
            .planner_cfg
            .clone()
            .expect("control ticks only for live policies");
        let now = self.now;
        for g in self.groups.values() {
            g.sync(&mut self.reqs);
        }
        self.sync_bound();
        let inflight: Vec<InFlight> = self
            .reqs
            .iter()
            .filter(|r| r.arrival <= now && r.finish.is_none() && !r.dropped)
            .map(|r| InFlight {
                tier: r.tier.index(),
                generated: f64::from(r.generated),
                age_s: now - r.arrival,
                feasible: r.class == Class::Feasible,
            })
            .collect();
        let running: Vec<(&str, f64)> = inflight
            .iter()
            .map(|r| (self.cfg.tiers[r.tier].name.as_str(), r.generated))
            .collect();
        let demand = self.stats.snapshot(now, &running);
        let levels = planner::candidate_levels(&self.profile, &pc, self.cfg.devices);
        let mut strategy = self.strategy.expect("live policies have a strategy");
        let every = u64::from(self.cfg.lookahead.every_windows.max(1));
        let round = self.windows.is_multiple_of(every);
        if let Some(chooser) = self.chooser.as_mut().filter(|_| round) {
            let arrivals = self.stats.recent_arrivals(now, chooser.lookback_s());
            let recent = recent_of(&self.cfg.tiers, &arrivals);
            let situation = Situation {
                profile: &self.profile,
                tiers: &self.cfg.tiers,
                demand: &demand,
                inflight: &inflight,
                recent: &recent,
                history_s: now,
                devices: self.cfg.devices,
                levels: &levels,
                planner: &pc,
                knobs: EngineKnobs::of(&self.cfg),
            };
            let (reqs, tiers) = (&self.reqs, &self.cfg.tiers);
            let delivered = |t0: f64, t1: f64| delivered_rps(reqs, tiers, t0, t1);
            let choice = chooser.round(&situation, now, &delivered);
            strategy = choice.chosen;
            self.choices.push((now, choice));
        }
        self.windows += 1;
        self.strategy = Some(strategy);
        // NOTE: every strategy re-plans every window, as the lookahead predicted it (a split
        // sized on one window's shares would otherwise stay while the shares move);
        // placement keeps unchanged groups where they are.
        let planned = plan_strategy(
            strategy,
            &self.profile,
            &self.cfg.tiers,
            &demand,
            self.cfg.devices,
            Some(&self.plan),
            &pc,
        );
        self.apply(planned, true);
        let pending = self.reqs.iter().any(|r| r.finish.is_none() && !r.dropped);
        if (pending || self.open) && self.now + self.cfg.window_s <= self.end {
            self.push(self.now + self.cfg.window_s, Kind::Control);
        }
    }
}

/// Weighted requests arrived in `[t0, t1)` that finished meeting their SLOs, per second.
fn delivered_rps(reqs: &Reqs, tiers: &[crate::tiers::Tier], t0: f64, t1: f64) -> f64 {
    let met: f64 = reqs
        .iter()
        .filter(|r| r.arrival >= t0 && r.arrival < t1 && !tiers[r.tier.index()].background)
        // The same SLO check as the result's records (`report::record`).
        .filter(|r| report::record(0, r, tiers).met)
        .map(|r| tiers[r.tier.index()].weight)
        .sum();
    met / (t1 - t0).max(1e-9)
}
