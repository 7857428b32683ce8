//! The simulated cluster's state and its run: built from a config (or as a shadow run),
//! played to the end, summarized. Its event loop is `event_loop.rs`, a request's way
//! through the groups `routing.rs`, the control tick `control.rs`, plan changes
//! `reconfigure.rs` and TP bindings `bind.rs`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BinaryHeap};

use anyhow::{ensure, Context, Result};

use crate::binding::BindingModel;
use crate::dispatch::{Class, Dispatcher};
use crate::ids::TierId;
use crate::plan::Plan;
use crate::planner::strategy::{plan_strategy, Strategy};
use crate::planner::PlannerConfig;
use crate::profile::Profile;
use crate::stats::{StatsConfig, WindowStats, DEFAULT_PRIOR_LENGTHS};

use super::bind_types::{BindCounts, BindRecord, Binding};
use super::choice::{Choice, Choose};
use super::event_queue::{Event, Kind};
use super::group::GroupSim;
use super::policy::Policy;
use super::policy_plans;
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
    pub(super) windows: u64,
    /// Policy `nitsum`: the strategy choice across rounds.
    pub(super) chooser: Option<Box<dyn Choose>>,
    /// Every selection round of policy `nitsum`; see `SimResult::choices`.
    pub(super) choices: Vec<(f64, Choice)>,
    pub(super) events: BinaryHeap<Event>,
    /// Requests by (arrival, index): the arrivals, read in order instead of queued as events
    /// (the heap then holds only the groups' few events).
    pub(super) arrivals: Vec<usize>,
    pub(super) next_arrival: usize,
    /// Arrival `i` orders as an event pushed with sequence number `arrival_seq + 1 + i`.
    pub(super) arrival_seq: u64,
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
    pub(super) open: bool,
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
                policy_plans::planner_config(&cfg, &profile)?,
                policy_plans::initial_strategy(&cfg.policy),
            ),
        };
        let initial = match (&planner_cfg, strategy) {
            (Some(pc), Some(s)) => {
                plan_strategy(s, &profile, &cfg.tiers, &[], cfg.devices, None, pc)
            }
            _ => policy_plans::static_plan(&cfg, &profile)?,
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
            policy_plans::trace_span(&self.cfg),
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
