//! The event loop: arrivals → Dispatcher → group engines; iteration completions; KV
//! handoffs; and, for live policies, a control tick every window that re-plans (stats →
//! planner → diff → reconfigure with switch and KV-migration pauses).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use anyhow::{ensure, Context, Result};

use crate::dispatch::{Class, DispatchRequest, Dispatcher};
use crate::plan::{Plan, Role};
use crate::planner::{self, Planned, PlannerConfig};
use crate::profile::Profile;
use crate::stats::{StatsConfig, WindowStats};

use super::engine::{Engine, Req};
use super::{policy, report, Policy, SimConfig, SimResult};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Arrival(usize),
    IterDone(u32, u64),
    Ready(u32, u64),
    KvArrived(usize, u32),
    Control,
}

#[derive(Debug)]
struct Event {
    t: f64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest (then first-pushed).
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

/// Simulation state.
pub struct Cluster<'a> {
    cfg: &'a SimConfig,
    profile: Profile,
    reqs: Vec<Req>,
    groups: BTreeMap<u32, Engine>,
    plan: Plan,
    dispatcher: Dispatcher,
    stats: WindowStats,
    planner_cfg: Option<PlannerConfig>,
    events: BinaryHeap<Event>,
    seq: u64,
    now: f64,
    end: f64,
    reconfigs: u64,
    moved: u64,
    /// Engine generations are unique across the run, so a dissolved group's late events
    /// never match the group that replaces it at the same leader.
    next_gen: u64,
}

impl<'a> Cluster<'a> {
    pub fn new(cfg: &'a SimConfig) -> Result<Self> {
        let profile = Profile::from_file(cfg.profile.clone()).context("simulate")?;
        ensure!(cfg.devices > 0, "simulate: devices must be positive");
        ensure!(cfg.window_s > 0.0, "simulate: window_s must be positive");
        let index: HashMap<&str, usize> = cfg
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut reqs = Vec::with_capacity(cfg.requests.len());
        for (i, r) in cfg.requests.iter().enumerate() {
            let tier = *index
                .get(r.tier.as_str())
                .with_context(|| format!("simulate: request {i} has unknown tier {:?}", r.tier))?;
            ensure!(
                r.input_len > 0 && r.output_len > 0,
                "simulate: request {i} has a zero length"
            );
            reqs.push(Req {
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
            });
        }
        let planner_cfg = policy::planner_config(cfg, &profile)?;
        let initial = match &planner_cfg {
            Some(pc) => planner::plan(&profile, &cfg.tiers, &[], cfg.devices, None, pc),
            None => policy::static_plan(cfg, &profile)?,
        };
        let last = reqs.iter().map(|r| r.arrival).fold(0.0, f64::max);
        let mut c = Cluster {
            cfg,
            profile,
            reqs,
            groups: BTreeMap::new(),
            plan: Plan::default(),
            dispatcher: Dispatcher::default(),
            stats: WindowStats::new(StatsConfig {
                rate_window_s: cfg.window_s,
                ..StatsConfig::default()
            }),
            planner_cfg,
            events: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            end: last + cfg.drain_s,
            reconfigs: 0,
            moved: 0,
            next_gen: 0,
        };
        c.apply(initial, false);
        for i in 0..c.reqs.len() {
            c.push(c.reqs[i].arrival, Kind::Arrival(i));
        }
        if c.planner_cfg.is_some() {
            c.push(cfg.window_s, Kind::Control);
        }
        Ok(c)
    }

    /// Run to completion (or `drain_s` after the last arrival) and summarize.
    pub fn run(mut self) -> Result<SimResult> {
        while let Some(ev) = self.events.pop() {
            if ev.t > self.end {
                break;
            }
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
                Kind::Control => self.on_control(),
            }
        }
        let records = (0..self.reqs.len())
            .map(|i| report::record(i, &self.reqs[i], &self.cfg.tiers))
            .collect();
        Ok(report::summarize(
            policy_name(&self.cfg.policy),
            self.cfg.devices,
            policy::trace_span(self.cfg),
            &self.cfg.tiers,
            records,
            (self.reconfigs, self.moved),
            self.cfg.records,
        ))
    }

    fn push(&mut self, t: f64, kind: Kind) {
        self.seq += 1;
        self.events.push(Event {
            t,
            seq: self.seq,
            kind,
        });
    }

    fn on_arrival(&mut self, r: usize) {
        let tier = &self.cfg.tiers[self.reqs[r].tier];
        self.stats
            .on_arrival(self.now, &tier.name, self.reqs[r].input);
        let req = DispatchRequest {
            tier: &tier.name,
            background: tier.background,
        };
        let Some(d) = self.dispatcher.dispatch(r as u64, &req) else {
            self.reqs[r].dropped = true;
            return;
        };
        self.reqs[r].class = d.class;
        // Split rejects what its tier's partition cannot serve within SLO.
        if matches!(self.cfg.policy, Policy::Split { .. }) && d.class == Class::BestEffort {
            self.reqs[r].dropped = true;
            self.dispatcher.complete(r as u64);
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
        self.groups
            .get_mut(&d.prefill_leader)
            .expect("dispatcher routes to planned groups")
            .push_prefill(r, d.class);
        self.kick(d.prefill_leader);
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

    fn done(&mut self, r: usize) {
        self.dispatcher.complete(r as u64);
        let tier = &self.cfg.tiers[self.reqs[r].tier].name;
        self.stats
            .on_completion(self.now, tier, self.reqs[r].output);
    }

    fn drop_request(&mut self, r: usize) {
        self.reqs[r].dropped = true;
        self.dispatcher.complete(r as u64);
    }

    fn transfer_s(&self, bytes: f64) -> f64 {
        bytes / (self.cfg.kv_bandwidth_gbps * 1e9)
    }

    /// A decoding group: `want` if it still decodes, else the group holding device `near`,
    /// else the least-loaded decoding group.
    fn decode_target(&self, want: Option<u32>, near: Option<u32>) -> Option<u32> {
        let decodes = |l: &u32| self.groups.get(l).is_some_and(Engine::decodes);
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
    fn hand_to_decoder(&mut self, r: usize, want: Option<u32>, extra_pause_s: f64) {
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

    fn kick(&mut self, leader: u32) {
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
        if let Some(lat) = g.start(&self.reqs, &self.profile) {
            self.push(self.now + lat, Kind::IterDone(leader, gen));
        }
    }

    fn on_control(&mut self) {
        let pc = self
            .planner_cfg
            .clone()
            .expect("control ticks only for live policies");
        let demand = self.stats.snapshot(self.now);
        let planned = planner::plan(
            &self.profile,
            &self.cfg.tiers,
            &demand,
            self.cfg.devices,
            Some(&self.plan),
            &pc,
        );
        self.apply(planned, true);
        let pending = self.reqs.iter().any(|r| r.finish.is_none() && !r.dropped);
        if pending && self.now + self.cfg.window_s <= self.end {
            self.push(self.now + self.cfg.window_s, Kind::Control);
        }
    }

    /// Switch to a new plan: keep unchanged groups, dissolve the rest, re-home their requests.
    fn apply(&mut self, planned: Planned, pay: bool) {
        let mut old = std::mem::take(&mut self.groups);
        let mut orphans_pre = Vec::new();
        let mut orphans_dec = Vec::new();
        let mut changed = false;
        for (g, cap) in planned.plan.groups.iter().zip(&planned.batch_caps) {
            let l = g.leader();
            let cap = if *cap > 0.0 {
                *cap
            } else {
                self.profile.max_batch(g.tp)
            };
            let budget = match g.role {
                Role::Prefill => self.cfg.prefill_budget_tokens,
                _ => self.cfg.chunk_tokens,
            };
            let keep = old
                .get(&l)
                .is_some_and(|e| e.plan.members == g.members && e.plan.role == g.role);
            let engine = if keep {
                let mut e = old.remove(&l).expect("checked");
                e.plan = g.clone();
                e.batch_cap = cap as usize;
                e
            } else {
                changed = true;
                let same_devices = old.get(&l).is_some_and(|e| e.plan.members == g.members);
                let pause = if pay && !same_devices {
                    self.moved += u64::from(g.tp);
                    self.cfg.switch_ms / 1000.0
                } else {
                    0.0
                };
                self.next_gen += 1;
                Engine::new(
                    g.clone(),
                    cap as usize,
                    budget,
                    self.now + pause,
                    self.next_gen,
                )
            };
            let mut engine = engine;
            // SLO groups keep lower-class work within their tier's iteration target: TPOT for
            // decoding groups, the planner's prefill batch bound for prefill-only groups.
            let slo_group = g.max_inflight > 0.0 && g.max_inflight.is_finite();
            let mine = self.cfg.tiers.iter().filter(|t| g.tiers.contains(&t.name));
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
            let (pre, dec) = e.drain();
            orphans_pre.extend(pre);
            orphans_dec.extend(dec.into_iter().map(|r| (r, l)));
        }
        self.plan = planned.plan;
        self.dispatcher.set_plan(&self.plan);
        if changed && pay {
            self.reconfigs += 1;
        }
        // Waiting requests move as metadata; partially prefilled KV moves with them.
        for r in orphans_pre {
            let tier = &self.cfg.tiers[self.reqs[r].tier];
            let req = DispatchRequest {
                tier: &tier.name,
                background: tier.background,
            };
            match self.dispatcher.dispatch(r as u64, &req) {
                Some(d) => {
                    if d.class != Class::Feasible {
                        self.dispatcher.complete(r as u64);
                    }
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

fn policy_name(p: &Policy) -> String {
    match p {
        Policy::Nitsum => "nitsum".into(),
        Policy::NitsumFixedTp { tp } => format!("nitsum-fixed-tp{tp}"),
        Policy::StaticTp { tp } => format!("static-tp{tp}"),
        Policy::Split { .. } => "split".into(),
    }
}
