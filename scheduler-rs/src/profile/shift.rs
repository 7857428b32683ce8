//! How a group picks between TP and SP per iteration (Shift Parallelism), and the curve it
//! runs as a result.

use super::curves::interp;

/// How a group of one size picks between TP and SP per iteration.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shift {
    /// SP above this many batched tokens.
    Above(f64),
    /// Never SP (the profile's threshold is null).
    TpOnly,
    /// No threshold given: the faster of the two at every point.
    Faster,
}

impl Shift {
    pub(super) fn of(threshold: Option<&Option<f64>>) -> Self {
        match threshold {
            Some(Some(t)) => Shift::Above(*t),
            Some(None) => Shift::TpOnly,
            None => Shift::Faster,
        }
    }

    /// The latency at `tokens` batched tokens, given both modes' latencies there.
    pub(super) fn pick(self, tokens: f64, tp_ms: f64, sp_ms: f64) -> f64 {
        match self {
            Shift::Above(t) if tokens > t => sp_ms,
            Shift::Above(_) | Shift::TpOnly => tp_ms,
            Shift::Faster => tp_ms.min(sp_ms),
        }
    }

    /// The curve the group runs, at the union of the two curves' points.
    pub(super) fn combine(self, tp: &[(f64, f64)], sp: &[(f64, f64)]) -> Vec<(f64, f64)> {
        let mut xs: Vec<f64> = tp.iter().chain(sp).map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs.into_iter()
            .map(|x| (x, self.pick(x, interp(tp, x), interp(sp, x))))
            .collect()
    }
}
