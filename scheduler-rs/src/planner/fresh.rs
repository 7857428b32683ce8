//! The planner proper (architecture §4 steps 1-4, without hysteresis): per-tier candidates from the
//! efficiency estimates, the weighted greedy, leftover best-effort groups and placement.

use crate::ids::TierId;
use crate::plan::{Plan, Role};
use crate::profile::{Profile, Shape};
use crate::stats::{LengthStats, TierDemand};
use crate::tiers::Tier;

use super::config::PlannerConfig;
use super::efficiency::{self, GroupEstimate};
use super::greedy::{self, Unit};
use super::placement::{self, Wanted};
use super::planned::Planned;
use super::score::{planned_rate, shape};

/// The planner proper (steps 1-4), without hysteresis.
pub(super) fn plan_fresh(
    profile: &Profile,
    tiers: &[Tier],
    by_tier: &[Option<&TierDemand>],
    devices: u32,
    previous: Option<&Plan>,
    cfg: &PlannerConfig,
    levels: &[Shape],
) -> Planned {
    let mut rates = Vec::with_capacity(tiers.len());
    let mut weights = Vec::with_capacity(tiers.len());
    let mut units: Vec<Unit> = Vec::new();
    let mut best_mixed: Vec<Option<(Shape, f64)>> = Vec::with_capacity(tiers.len());
    for (i, tier) in tiers.iter().enumerate() {
        let d = by_tier[i];
        rates.push(planned_rate(tier, d, cfg));
        weights.push(tier.weight.max(0.0));
        best_mixed.push(None);
        let (Some(d), false) = (d, tier.background) else {
            continue;
        };
        let shape = shape(tier, d, cfg);
        let mut pre: Vec<(Shape, GroupEstimate)> = Vec::new();
        let mut dec: Vec<(Shape, GroupEstimate)> = Vec::new();
        for &t in levels {
            if let Some(e) = efficiency::mixed(profile, t, &shape, cfg.chunk_tokens) {
                let per_dev = e.rps / f64::from(t.devices());
                if best_mixed[i].is_none_or(|(_, b)| per_dev > b) {
                    best_mixed[i] = Some((t, per_dev));
                }
                units.push(Unit::mixed(TierId(i), t, e));
            }
            if cfg.disaggregation {
                let slack = cfg.prefill_slack;
                pre.extend(
                    efficiency::prefill(profile, t, &shape, slack, cfg.max_prefill_batch)
                        .map(|e| (t, e)),
                );
                dec.extend(efficiency::decode(profile, t, &shape).map(|e| (t, e)));
            }
        }
        units.extend(bundles(i, &pre, &dec, devices));
    }
    let (picks, mut free) = greedy::assign(&units, &rates, &weights, devices);

    let mut wanted: Vec<Wanted> = Vec::new();
    for &k in &picks {
        let u = &units[k];
        for g in &u.groups {
            wanted.push(Wanted {
                shape: g.shape,
                role: g.role,
                tiers: vec![u.tier],
                accepts_background: false,
                max_rps: g.est.rps,
                max_inflight: g.est.rps * g.est.residence_s,
                batch_cap: g.est.batch_cap,
            });
        }
    }
    // Leftover devices: best-effort/background groups at the level that is most efficient for
    // the busiest tier (largest first when that level no longer fits). With no demand at all
    // (start-up, idle), for the tightest tier under the prior request shape: the first window
    // of a burst lands on these groups, and TP 1 groups under a strict TPOT can sink it.
    let busiest = (0..tiers.len())
        .filter(|&i| best_mixed[i].is_some())
        .max_by(|&a, &b| rates[a].total_cmp(&rates[b]).then(b.cmp(&a)));
    let leftover_tp = match busiest {
        Some(i) => best_mixed[i].map(|(t, _)| t),
        None if rates.iter().all(|&r| r <= 0.0) => idle_level(profile, tiers, levels, cfg),
        None => None,
    }
    .or(levels.first().copied());
    let mut any_leftover = false;
    for &t in levels.iter().rev() {
        // The leftover shape itself, then smaller ones (never another of the same size).
        let skip = |l: Shape| t.devices() > l.devices() || (t.devices() == l.devices() && t != l);
        if leftover_tp.is_some_and(skip) {
            continue;
        }
        while free >= t.devices() {
            free -= t.devices();
            any_leftover = true;
            wanted.push(Wanted {
                shape: t,
                role: Role::Mixed,
                tiers: Vec::new(),
                accepts_background: true,
                max_rps: 0.0,
                max_inflight: 0.0,
                batch_cap: 0.0,
            });
        }
    }
    if !any_leftover {
        // NOTE: background requests must always have somewhere to go; local schedulers run
        // them only in batch slots the feasible and best-effort queues leave empty.
        for w in wanted.iter_mut().filter(|w| w.role != Role::Decode) {
            w.accepts_background = true;
        }
    }
    Planned::from_placed(placement::place(wanted, devices, previous), previous)
}

/// Disaggregated candidates of tier `i` that fit `devices`: the most device-efficient bundle
/// over all (prefill, decode) level pairs, and the smallest one (fewest devices, then most
/// efficient) so a small pool or the seeding round still finds a bundle that fits. More would
/// only slow the greedy down.
fn bundles(
    i: usize,
    pre: &[(Shape, GroupEstimate)],
    dec: &[(Shape, GroupEstimate)],
    devices: u32,
) -> Vec<Unit> {
    let (mut best, mut smallest): (Option<Unit>, Option<Unit>) = (None, None);
    for &p in pre {
        for &d in dec {
            let Some(u) = Unit::disaggregated(TierId(i), p, d, devices) else {
                continue;
            };
            if best
                .as_ref()
                .is_none_or(|b| u.efficiency() > b.efficiency())
            {
                best = Some(u.clone());
            }
            // The fewest devices any bundle of this pair can use: one group of each.
            let Some(one) = Unit::disaggregated(TierId(i), p, d, p.0.devices() + d.0.devices())
            else {
                continue;
            };
            let better = smallest
                .as_ref()
                .is_none_or(|s| (one.devices, -one.efficiency()) < (s.devices, -s.efficiency()));
            if better {
                smallest = Some(one);
            }
        }
    }
    let mut out: Vec<Unit> = best.into_iter().collect();
    out.extend(smallest.filter(|s| out.first() != Some(s)));
    out
}

/// TP level for groups planned without any demand: the most device-efficient mixed level for
/// the tier with the tightest TPOT under `cfg.prior_lengths`, or the smallest level that
/// meets its SLOs at all; `None` when no level does (or no tier has an SLO).
fn idle_level(
    profile: &Profile,
    tiers: &[Tier],
    levels: &[Shape],
    cfg: &PlannerConfig,
) -> Option<Shape> {
    let tightest = tiers
        .iter()
        .filter(|t| !t.background)
        .min_by(|a, b| a.tpot_ms.total_cmp(&b.tpot_ms))?;
    let (prompt, output) = cfg.prior_lengths;
    let prior = TierDemand {
        tier: tightest.name.clone(),
        rate_rps: 0.0,
        prompt: LengthStats::constant(prompt),
        output: LengthStats::constant(output),
    };
    let shape = shape(tightest, &prior, cfg);
    levels
        .iter()
        .filter_map(|&t| {
            efficiency::mixed(profile, t, &shape, cfg.chunk_tokens)
                .map(|e| (t, e.rps / f64::from(t.devices())))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(t, _)| t)
}
