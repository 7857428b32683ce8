//! The event loop: arrivals → Dispatcher → group engines; iteration completions; KV
//! handoffs; and, for live policies, a control tick every window that re-plans (stats →
//! planner → `reconfigure.rs`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BinaryHeap};

use anyhow::{ensure, Context, Result};

use crate::binding::BindingModel;
use crate::dispatch::{Class, DispatchRequest, Dispatcher};
use crate::ids::TierId;
use crate::plan::Plan;
use crate::planner::strategy::{plan_strategy, Strategy};
use crate::planner::{self, PlannerConfig};
use crate::profile::Profile;
use crate::stats::{StatsConfig, WindowStats, DEFAULT_PRIOR_LENGTHS};

use super::bind_types::{BindCounts, BindRecord, Binding};
use super::choice::{Choice, Choose};
use super::events::{Event, Kind};
use super::forecast::{recent_of, InFlight};
use super::group::GroupSim;
use super::lookahead::{EngineKnobs, Situation};
use super::policy::{self, Policy};
use super::reqs::{Req, Reqs};
use super::{report, SimConfig, SimResult, TraceRequest};

/// Simulation state.
pub struct Cluster<'a> {
    pub(super) cfg: Cow<'a, SimConfig>,
    pub(super) profile: Profile,
    pub(super) reqs: Reqs,
    pub(super) groups: BTreeMap<u32, GroupSim>,
    pub(super) plan: Plan,
    pub(super) dispatcher: Dispatcher,
    pub(super) stats: WindowStats,
    pub(super) planner_cfg: Option<PlannerConfig>,
    /// Live policies: the layout strategy in force (`nitsum` re-chooses it).
    pub(super) strategy: Option<Strategy>,
    /// Control windows so far (selection rounds run every `lookahead.every_windows`).
    windows: u64,
    /// Policy `nitsum`: the strategy choice across rounds.
    chooser: Option<Box<dyn Choose>>,
    /// Every selection round of policy `nitsum`; see `SimResult::choices`.
    choices: Vec<(f64, Choice)>,
    pub(super) events: BinaryHeap<Event>,
    /// Requests by (arrival, index): the arrivals, read in order instead of queued as events
    /// (the heap then holds only the groups' few events).
    pub(super) arrivals: Vec<usize>,
    pub(super) next_arrival: usize,
    /// Arrival `i` orders as an event pushed with sequence number `arrival_seq + 1 + i`.
    arrival_seq: u64,
    pub(super) seq: u64,
    pub(super) now: f64,
    pub(super) end: f64,
    pub(super) reconfigs: u64,
    /// (time, layout) of every plan switched to; see `SimResult::timeline`.
    pub(super) timeline: Vec<(f64, String)>,
    pub(super) moved: u64,
    /// Engine generations are unique across the run, so a dissolved group's late events
    /// never match the group that replaces it at the same leader.
    pub(super) next_gen: u64,
    /// The binding cost model over `profile` (the worker's, through `nitsum._core`).
    pub(super) binder: BindingModel,
    /// Bindings in force, oldest first (`sim::bind`).
    pub(super) bindings: Vec<Binding>,
    pub(super) next_binding: u64,
    pub(super) bind_counts: BindCounts,
    pub(super) bind_log: Vec<BindRecord>,
    /// A shadow run (`sim::shadow`): arrivals are appended as they happen, it never ends and
    /// its control ticks go on with nothing in flight.
    open: bool,
}

impl<'a> Cluster<'a> {
    /// A run of `cfg`; `chooser` makes the selection rounds of the adaptive policy.
    pub fn new(cfg: &'a SimConfig, chooser: Option<Box<dyn Choose>>) -> Result<Self> {
        let mut c = Self::build(Cow::Borrowed(cfg), None)?;
        c.chooser = chooser;
        Ok(c)
    }

    /// A shadow run of `strategy` from time `start` (`sim::shadow`), planning with `planner`
    /// (the pool's settings): `cfg` has no requests, they are appended as they arrive.
    pub(super) fn shadow(
        cfg: SimConfig,
        strategy: Strategy,
        planner: PlannerConfig,
        start: f64,
    ) -> Result<Self> {
        Self::build(Cow::Owned(cfg), Some((strategy, planner, start)))
    }

    fn build(
        cfg: Cow<'a, SimConfig>,
        shadow: Option<(Strategy, PlannerConfig, f64)>,
    ) -> Result<Self> {
        let profile = Profile::from_file(cfg.profile.clone()).context("simulate")?;
        ensure!(cfg.devices > 0, "simulate: devices must be positive");
        ensure!(cfg.window_s > 0.0, "simulate: window_s must be positive");
        let reqs = cfg
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| req_of(&cfg, i, r))
            .collect::<Result<Vec<Req>>>()?;
        let reqs = Reqs::from(reqs);
        let (planner_cfg, strategy) = match &shadow {
            Some((st, pc, _)) => (Some(pc.clone()), Some(*st)),
            None => (
                policy::planner_config(&cfg, &profile)?,
                policy::initial_strategy(&cfg.policy),
            ),
        };
        let initial = match (&planner_cfg, strategy) {
            (Some(pc), Some(s)) => {
                plan_strategy(s, &profile, &cfg.tiers, &[], cfg.devices, None, pc)
            }
            _ => policy::static_plan(&cfg, &profile)?,
        };
        let (start, end) = match shadow {
            Some((_, _, start)) => (start, f64::INFINITY),
            None => (
                0.0,
                reqs.iter().map(|r| r.arrival).fold(0.0, f64::max) + cfg.drain_s,
            ),
        };
        let prior_output = planner_cfg
            .as_ref()
            .map_or(DEFAULT_PRIOR_LENGTHS.1, |pc| pc.prior_lengths.1);
        let stats = WindowStats::new(StatsConfig {
            rate_window_s: cfg.window_s,
            prior_output_tokens: prior_output,
            ..StatsConfig::default()
        });
        let open = shadow.is_some();
        let binder = BindingModel::new(profile.clone());
        let mut c = Cluster {
            cfg,
            profile,
            binder,
            bindings: Vec::new(),
            next_binding: 0,
            bind_counts: BindCounts::default(),
            bind_log: Vec::new(),
            reqs,
            groups: BTreeMap::new(),
            plan: Plan::default(),
            dispatcher: Dispatcher::default(),
            stats,
            planner_cfg,
            strategy,
            windows: 0,
            chooser: None,
            choices: Vec::new(),
            events: BinaryHeap::new(),
            arrivals: Vec::new(),
            next_arrival: 0,
            arrival_seq: 0,
            seq: 0,
            now: start,
            end,
            reconfigs: 0,
            timeline: Vec::new(),
            moved: 0,
            next_gen: 0,
            open,
        };
        c.apply(initial, false);
        // NOTE: the arrivals take the sequence numbers they had as events pushed here, in
        // index order, so that ties with other events break exactly as they would.
        let mut order: Vec<usize> = (0..c.reqs.len()).collect();
        order.sort_by(|&a, &b| {
            c.reqs[a]
                .arrival
                .total_cmp(&c.reqs[b].arrival)
                .then(a.cmp(&b))
        });
        c.arrivals = order;
        c.arrival_seq = c.seq;
        c.seq += c.reqs.len() as u64;
        if c.planner_cfg.is_some() {
            c.push(start + c.cfg.window_s, Kind::Control);
        }
        Ok(c)
    }

    /// Run to completion (or `drain_s` after the last arrival) and summarize.
    pub fn run(mut self) -> Result<SimResult> {
        self.play();
        let records = (0..self.reqs.len())
            .map(|i| report::record(i, &self.reqs[i], &self.cfg.tiers))
            .collect();
        let mut result = report::summarize(
            Policy::name(&self.cfg.policy),
            self.cfg.devices,
            policy::trace_span(&self.cfg),
            &self.cfg.tiers,
            records,
            (self.reconfigs, self.moved),
            self.cfg.records,
        );
        result.timeline = self.timeline;
        result.bindings = self.bind_counts;
        result.bind_log = self.bind_log;
        result.choices = self.choices;
        Ok(result)
    }

    /// Run to completion; (arrival, tier, met) of every request, in config order.
    pub fn outcomes(mut self) -> Vec<(f64, TierId, bool)> {
        self.play();
        let tiers = &self.cfg.tiers;
        self.reqs
            .iter()
            .map(|r| (r.arrival, r.tier, report::met(r, &tiers[r.tier.index()])))
            .collect()
    }

    fn play(&mut self) {
        self.advance(self.end);
    }

    /// Process every event up to time `until` (arrivals included).
    pub(super) fn advance(&mut self, until: f64) {
        while let Some(ev) = self.next_event(until) {
            self.now = ev.t;
            match ev.kind {
                Kind::Arrival(r) => self.on_arrival(r),
                Kind::IterDone(l, gen) => self.on_iteration(l, gen),
                Kind::Ready(l, gen) => {
                    if self.groups.get(&l).is_some_and(|g| g.generation == gen) {
                        self.kick(l);
                    }
                }
                Kind::KvArrived(r, l) => self.hand_to_decoder(r, Some(l), 0.0),
                Kind::BoundFirst(r, id) => self.on_bound_first(r, id),
                Kind::BoundDone(r, id) => self.on_bound_done(r, id),
                Kind::Control => self.on_control(),
            }
        }
    }

    /// The earliest of the queued events and the next arrival, if it comes by `until`.
    fn next_event(&mut self, until: f64) -> Option<Event> {
        let arrival = self.arrivals.get(self.next_arrival).map(|&i| Event {
            t: self.reqs[i].arrival,
            seq: self.arrival_seq + 1 + i as u64,
            kind: Kind::Arrival(i),
        });
        let first = match (&arrival, self.events.peek()) {
            (Some(a), Some(e)) => a.t.min(e.t),
            (Some(a), None) => a.t,
            (None, Some(e)) => e.t,
            (None, None) => return None,
        };
        if first > until {
            return None;
        }
        match (arrival, self.events.peek()) {
            // `Event` orders reversed (for the max-heap): greater = earlier.
            (Some(a), Some(e)) if *e > a => self.events.pop(),
            (Some(a), _) => {
                self.next_arrival += 1;
                Some(a)
            }
            (None, _) => self.events.pop(),
        }
    }

    pub(super) fn push(&mut self, t: f64, kind: Kind) {
        self.seq += 1;
        self.events.push(Event {
            t,
            seq: self.seq,
            kind,
        });
    }

    fn on_arrival(&mut self, r: usize) {
        let tier = &self.cfg.tiers[self.reqs[r].tier.index()];
        self.stats
            .on_arrival(self.now, &tier.name, self.reqs[r].input);
        let req = DispatchRequest {
            tier: self.reqs[r].tier,
            background: tier.background || self.reqs[r].leftover,
            affinity: None,
        };
        let Some(d) = self.dispatcher.dispatch(r as u64, &req) else {
            self.reqs[r].dropped = true;
            return;
        };
        self.reqs[r].class = d.class;
        // Split rejects what its tier's partition cannot serve within SLO, and so does a
        // tier with `reject_unattainable` (as the router answers 429 `slo_unattainable`).
        let rejects = self.rejects_best_effort() || tier.reject_unattainable;
        if rejects && d.class == Class::BestEffort {
            self.drop_request(r);
            return;
        }
        // NOTE: only feasible work is charged against a group's SLO bandwidth: best-effort
        // and background requests run on leftover capacity (the local scheduler serves them
        // last and preempts them), so charging them would let a spill backlog mark every
        // later request infeasible. The router should do the same (docs/planner.md).
        if d.class != Class::Feasible {
            self.dispatcher.complete(r as u64);
        }
        self.reqs[r].decode_leader = d.decode_leader;
        if !self.try_bind(r, d.prefill_leader, d.class) {
            self.groups
                .get_mut(&d.prefill_leader)
                .expect("dispatcher routes to planned groups")
                .push_prefill(r, d.class);
            self.kick(d.prefill_leader);
        }
        if !self.bindings.is_empty() {
            self.reconsider_block_of(d.prefill_leader);
        }
    }

    fn on_iteration(&mut self, leader: u32, gen: u64) {
        let Some(g) = self.groups.get_mut(&leader) else {
            return;
        };
        if g.generation != gen || !g.busy() {
            return;
        }
        let out = g.finish(&mut self.reqs, self.now);
        for r in out.finished {
            self.done(r);
        }
        for r in out.handoff {
            let bytes = f64::from(self.reqs[r].input) * self.cfg.kv_bytes_per_token;
            let target = self.decode_target(self.reqs[r].decode_leader, None);
            match target {
                Some(l) => self.push(self.now + self.transfer_s(bytes), Kind::KvArrived(r, l)),
                None => self.drop_request(r),
            }
        }
        self.kick(leader);
    }

    pub(super) fn done(&mut self, r: usize) {
        self.dispatcher.complete(r as u64);
        let tier = &self.cfg.tiers[self.reqs[r].tier.index()].name;
        self.stats
            .on_completion(self.now, tier, self.reqs[r].output);
    }

    pub(super) fn drop_request(&mut self, r: usize) {
        self.reqs[r].dropped = true;
        self.dispatcher.complete(r as u64);
    }

    pub(super) fn transfer_s(&self, bytes: f64) -> f64 {
        bytes / (self.cfg.kv_bandwidth_gbps * 1e9)
    }

    /// A decoding group: `want` if it still decodes, else the group holding device `near`,
    /// else the least-loaded decoding group.
    pub(super) fn decode_target(&self, want: Option<u32>, near: Option<u32>) -> Option<u32> {
        let decodes = |l: &u32| self.groups.get(l).is_some_and(GroupSim::decodes);
        if let Some(l) = want.filter(decodes) {
            return Some(l);
        }
        if let Some(d) = near {
            let holder = self
                .groups
                .iter()
                .find(|(_, g)| g.plan.members.contains(&d));
            if let Some((&l, _)) = holder.filter(|(_, g)| g.decodes()) {
                return Some(l);
            }
        }
        self.groups
            .iter()
            .filter(|(_, g)| g.decodes())
            .min_by_key(|(_, g)| g.load())
            .map(|(&l, _)| l)
    }

    /// Hand a prefilled request to a decode group (`extra_pause_s` for migrated KV).
    pub(super) fn hand_to_decoder(&mut self, r: usize, want: Option<u32>, extra_pause_s: f64) {
        let Some(l) = self.decode_target(want, want) else {
            self.drop_request(r);
            return;
        };
        let class = self.reqs[r].class;
        let g = self.groups.get_mut(&l).expect("target exists");
        g.ready_at = g.ready_at.max(self.now + extra_pause_s);
        g.push_decode(r, class);
        self.kick(l);
    }

    pub(super) fn kick(&mut self, leader: u32) {
        let Some(g) = self.groups.get_mut(&leader) else {
            return;
        };
        if g.busy() {
            return;
        }
        let gen = g.generation;
        if self.now < g.ready_at {
            let at = g.ready_at;
            self.push(at, Kind::Ready(leader, gen));
            return;
        }
        let started = g.start(&mut self.reqs, &self.profile, self.now);
        // A demoted request no longer holds SLO bandwidth at the dispatcher.
        for r in g.take_demoted() {
            self.dispatcher.complete(r as u64);
        }
        if let Some(lat) = started {
            g.busy_until = self.now + lat;
            self.push(self.now + lat, Kind::IterDone(leader, gen));
        }
    }

    /// Whether group engines demote requests past their TTFT deadline: Nitsum's local
    /// scheduler does; the baselines (SLO-agnostic FCFS, Split) keep their own rules.
    pub(super) fn demotes_late(&self) -> bool {
        !matches!(
            self.cfg.policy,
            Policy::Fixed(Strategy::StaticTp { .. } | Strategy::Split)
        )
    }

    /// Whether requests beyond the plan's SLO bandwidth are rejected (Split's rule).
    fn rejects_best_effort(&self) -> bool {
        match &self.cfg.policy {
            Policy::Fixed(Strategy::Split) => true,
            Policy::FixedPlan {
                reject_best_effort, ..
            } => *reject_best_effort,
            // NOTE: Nitsum running the split strategy serves what its partitions cannot take
            // on leftover capacity (as the router does), rather than rejecting it (tried:
            // rejecting under Nitsum's split gave 0.925 vs 0.938 geometric mean over the
            // 8-device sweep points, and halved conv-step ×30).
            _ => false,
        }
    }

    fn on_control(&mut self) {
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

/// The simulated state of request `i` of the trace (validated).
pub(super) fn req_of(cfg: &SimConfig, i: usize, r: &TraceRequest) -> Result<Req> {
    let tier = cfg
        .tiers
        .iter()
        .position(|t| t.name == r.tier)
        .map(TierId)
        .with_context(|| format!("simulate: request {i} has unknown tier {:?}", r.tier))?;
    ensure!(
        r.input_len > 0 && r.output_len > 0,
        "simulate: request {i} has a zero length"
    );
    Ok(Req {
        arrival: r.arrival_s,
        input: r.input_len,
        output: r.output_len,
        tier,
        class: Class::Feasible,
        prefilled: 0,
        generated: 0,
        first_token: None,
        finish: None,
        decode_leader: None,
        dropped: false,
        deadline: r.arrival_s + cfg.tiers[tier.index()].ttft_ms / 1000.0,
        stint: None,
        leftover: r.leftover,
    })
}
