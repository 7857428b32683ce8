//! Step 3 of the planner (architecture §4): weighted greedy assignment of device *units* to tiers.
//!
//! A unit is what one greedy step hands out: one mixed group of `t` devices, or one balanced
//! disaggregated bundle (`n_p` prefill groups of TP `t_p` + `n_d` decode groups of TP `t_d`,
//! `n_p, n_d ≤ MAX_PAIR`, chosen so `n_p·P ≈ n_d·D`). Handing out bundles keeps the
//! prefill/decode balance of the planner's step 2 (architecture §4) without orphan stages.

use crate::ids::TierId;
use crate::plan::Role;
use crate::profile::Shape;

use super::efficiency::GroupEstimate;

/// Largest group count per stage inside one disaggregated bundle.
pub const MAX_PAIR: u32 = 4;

/// One group inside a unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnitGroup {
    /// A TP level or a pipeline.
    pub shape: Shape,
    pub role: Role,
    pub est: GroupEstimate,
}

/// A candidate allocation step for one tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    /// The tier, by its position in the planner's tier list.
    pub tier: TierId,
    pub groups: Vec<UnitGroup>,
    pub devices: u32,
    /// SLO-compliant requests/s the whole unit serves.
    pub rps: f64,
}

impl Unit {
    /// One mixed group.
    pub fn mixed(tier: TierId, shape: impl Into<Shape>, est: GroupEstimate) -> Self {
        let shape = shape.into();
        Unit {
            tier,
            groups: vec![UnitGroup {
                shape,
                role: Role::Mixed,
                est,
            }],
            devices: shape.devices(),
            rps: est.rps,
        }
    }

    /// The most device-efficient balanced bundle of prefill groups (TP `tp_p`, estimate `p`)
    /// and decode groups (TP `tp_d`, estimate `d`) on at most `max_devices` devices; `None`
    /// when not even one group of each fits.
    pub fn disaggregated(
        tier: TierId,
        (shape_p, p): (impl Into<Shape>, GroupEstimate),
        (shape_d, d): (impl Into<Shape>, GroupEstimate),
        max_devices: u32,
    ) -> Option<Self> {
        let (shape_p, shape_d): (Shape, Shape) = (shape_p.into(), shape_d.into());
        let (tp_p, tp_d) = (shape_p.devices(), shape_d.devices());
        let mut best: Option<(f64, u32, u32)> = None;
        for np in 1..=MAX_PAIR {
            for nd in 1..=MAX_PAIR {
                if np * tp_p + nd * tp_d > max_devices {
                    continue;
                }
                let rps = (f64::from(np) * p.rps).min(f64::from(nd) * d.rps);
                let eff = rps / f64::from(np * tp_p + nd * tp_d);
                if best.is_none_or(|(b, _, _)| eff > b * (1.0 + 1e-12)) {
                    best = Some((eff, np, nd));
                }
            }
        }
        let (_, np, nd) = best?;
        let mut groups = Vec::with_capacity((np + nd) as usize);
        let stage = |shape, role, est| UnitGroup { shape, role, est };
        groups.extend((0..np).map(|_| stage(shape_p, Role::Prefill, p)));
        groups.extend((0..nd).map(|_| stage(shape_d, Role::Decode, d)));
        Some(Unit {
            tier,
            groups,
            devices: np * tp_p + nd * tp_d,
            rps: (f64::from(np) * p.rps).min(f64::from(nd) * d.rps),
        })
    }

    /// Requests/s per device.
    pub fn efficiency(&self) -> f64 {
        self.rps / f64::from(self.devices)
    }
}

/// Demand below this (requests/s) counts as met.
const EPS: f64 = 1e-9;

/// Weighted greedy (Nitsum §3.3.1): while devices and unmet demand remain, give the unit with
/// the best `min(rps, unmet_i)/devices × unmet_i/Σunmet × weight_i` to its tier. Returns the
/// chosen unit indices (into `units`) in pick order and the devices left over.
///
/// Before the greedy, a seeding round visits every tier with demand, most weighted demand
/// first, and gives it the unit with the best greedy score among those that still leave room
/// for the smallest unit of every tier after it: a tier with demand is never left without a
/// group when there are at least as many devices as tiers (the planner's fairness goal; the
/// weights alone only slow starvation down), and a busy tier is not locked into a small,
/// inefficient unit just because it was the smallest.
///
/// `demand[i]` is tier i's arrival rate (0 for background tiers); `weight[i]` its tier weight.
pub fn assign(units: &[Unit], demand: &[f64], weight: &[f64], devices: u32) -> (Vec<usize>, u32) {
    let mut unmet: Vec<f64> = demand.to_vec();
    let mut free = devices;
    let mut picks = Vec::new();
    let mut order: Vec<usize> = (0..demand.len()).filter(|&i| demand[i] > EPS).collect();
    order.sort_by(|&a, &b| (demand[b] * weight[b]).total_cmp(&(demand[a] * weight[a])));
    let smallest = |i: usize| {
        units
            .iter()
            .filter(|u| u.tier.index() == i)
            .map(|u| u.devices)
            .min()
    };
    let mut reserve: u32 = order.iter().filter_map(|&i| smallest(i)).sum();
    for i in order {
        reserve -= smallest(i).unwrap_or(0);
        // Within the budget when the later tiers' reserve fits, else anything that fits.
        let budget = if free >= reserve {
            free - reserve
        } else {
            free
        };
        let mut best: Option<(f64, u32, usize)> = None;
        for (k, u) in units.iter().enumerate() {
            if u.tier.index() != i || u.devices > budget {
                continue;
            }
            let score = u.rps.min(unmet[i]) / f64::from(u.devices);
            let better = best.is_none_or(|(s, d, _)| {
                score > s * (1.0 + 1e-12) || (score >= s * (1.0 - 1e-12) && u.devices < d)
            });
            if better {
                best = Some((score, u.devices, k));
            }
        }
        if let Some((_, d, k)) = best {
            free -= d;
            unmet[i] = (unmet[i] - units[k].rps).max(0.0);
            picks.push(k);
        }
    }
    loop {
        let total: f64 = unmet.iter().filter(|&&u| u > EPS).sum();
        if total <= EPS {
            break;
        }
        let mut best: Option<(f64, usize)> = None;
        for (k, u) in units.iter().enumerate() {
            let need = unmet[u.tier.index()];
            if need <= EPS || u.devices > free {
                continue;
            }
            let score =
                u.rps.min(need) / f64::from(u.devices) * (need / total) * weight[u.tier.index()];
            // NOTE: strict `>` with a relative margin: ties go to the earlier unit, which keeps
            // the plan deterministic and stable across windows with equal inputs.
            if best.is_none_or(|(s, _)| score > s * (1.0 + 1e-12)) {
                best = Some((score, k));
            }
        }
        let Some((score, k)) = best else { break };
        if score <= 0.0 {
            break;
        }
        let u = &units[k];
        free -= u.devices;
        unmet[u.tier.index()] = (unmet[u.tier.index()] - u.rps).max(0.0);
        picks.push(k);
    }
    (picks, free)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(rps: f64) -> GroupEstimate {
        GroupEstimate {
            rps,
            residence_s: 1.0,
            batch_cap: 1.0,
        }
    }

    #[test]
    fn bundle_balances_stages() {
        // P = 30 rps per TP1 prefill group, D = 10 per TP1 decode group: 1 prefill + 3 decode
        // serve 30 rps on 4 devices (7.5 per device), better than any other split ≤ 4×4.
        let u = Unit::disaggregated(TierId(0), (1, est(30.0)), (1, est(10.0)), 64).unwrap();
        assert_eq!((u.devices, u.rps), (4, 30.0));
        assert_eq!(
            u.groups.iter().filter(|g| g.role == Role::Decode).count(),
            3
        );
        // On 3 devices the best that fits is 1 + 2 (20 rps, 6.7 per device).
        let u = Unit::disaggregated(TierId(0), (1, est(30.0)), (1, est(10.0)), 3).unwrap();
        assert_eq!((u.devices, u.rps), (3, 20.0));
        assert!(Unit::disaggregated(TierId(0), (2, est(30.0)), (2, est(10.0)), 3).is_none());
    }

    #[test]
    fn seeding_takes_the_best_unit_that_leaves_room_for_later_tiers() {
        // Tier 0: TP1 at 10 rps or TP2 at 30 rps (15 per device); tier 1: TP1 at 5 rps.
        let units = [
            Unit::mixed(TierId(0), 1, est(10.0)),
            Unit::mixed(TierId(0), 2, est(30.0)),
            Unit::mixed(TierId(1), 1, est(5.0)),
        ];
        // Alone on 4 devices: two TP2 groups (60 rps), not TP1 + TP2 + TP1 (50 rps).
        assert_eq!(
            assign(&units, &[100.0, 0.0], &[1.0, 1.0], 4),
            (vec![1, 1], 0)
        );
        // With tier 1 waiting on 3 devices, tier 0 is seeded with TP2 within 3 − 1 devices.
        assert_eq!(
            assign(&units, &[100.0, 5.0], &[1.0, 1.0], 3),
            (vec![1, 2], 0)
        );
        // On 2 devices the reserve leaves tier 0 one device: both tiers get a group.
        assert_eq!(
            assign(&units, &[100.0, 5.0], &[1.0, 1.0], 2),
            (vec![0, 2], 0)
        );
    }

    #[test]
    fn weights_share_devices_by_unmet_demand() {
        // Tier 0: 10 rps/device, wants 100. Tier 1: 5 rps/device, wants 100. 4 devices.
        let units = [
            Unit::mixed(TierId(0), 1, est(10.0)),
            Unit::mixed(TierId(1), 1, est(5.0)),
        ];
        let (picks, free) = assign(&units, &[100.0, 100.0], &[1.0, 1.0], 4);
        // Seeding: one device each → unmet (90, 95). Greedy scores: (90,95) → 10·90/185 = 4.86
        // vs 5·95/185 = 2.57: tier 0; (80,95) → 4.57 vs 2.71: tier 0.
        assert_eq!((picks, free), (vec![0, 1, 0, 0], 0));
        // 12 devices: tier 0 wins while 10·u0 > 5·u1; at unmet (40, 95) tier 1's larger unmet
        // demand outweighs its lower efficiency (2.96 vs 3.52), and the two then alternate.
        let (picks, _) = assign(&units, &[100.0, 100.0], &[1.0, 1.0], 12);
        assert_eq!(picks, [0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1]);
    }
}
