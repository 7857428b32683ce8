//! Validated latency curves of one shape and their interpolation (see the `profile` module
//! docs): piecewise-linear prefill, bilinear decode, and the checks that build them.

use std::collections::BTreeMap;

use anyhow::{bail, ensure, Context, Result};

use super::profile_file::{DecodePoint, PrefillPoint};

/// Decode points of one context value, sorted by batch.
#[derive(Debug, Clone)]
pub(super) struct DecodeRow {
    pub(super) context: f64,
    /// (batch, ms) sorted by batch.
    pub(super) points: Vec<(f64, f64)>,
}

/// Validated curves of one TP level.
#[derive(Debug, Clone)]
pub(super) struct Curves {
    /// (tokens, ms) sorted by tokens.
    pub(super) prefill: Vec<(f64, f64)>,
    /// Rows sorted by context.
    pub(super) decode: Vec<DecodeRow>,
    /// The prefill forward's fixed part (see [`super::Profile::prefill_fixed_ms`]).
    pub(super) prefill_fixed_ms: f64,
}

/// Bilinear decode latency over rows sorted by context (see the module docs).
pub(super) fn rows_ms(rows: &[DecodeRow], batch: f64, context: f64) -> f64 {
    let at = |r: &DecodeRow| interp(&r.points, batch);
    let i = rows.partition_point(|r| r.context <= context);
    if rows.len() == 1 || i == 0 {
        return at(&rows[0]);
    }
    // Segment [lo, hi] around `context`; past the last row, extrapolate from the last two.
    let (lo, hi) = if i == rows.len() {
        (&rows[i - 2], &rows[i - 1])
    } else {
        (&rows[i - 1], &rows[i])
    };
    let (a, b) = (at(lo), at(hi));
    let w = (context - lo.context) / (hi.context - lo.context);
    (a + w * (b - a)).max(a.min(b))
}

fn check_point(x: f64, ms: f64, what: &str) -> Result<()> {
    if !(x.is_finite() && x > 0.0) {
        bail!("{what} must be positive and finite, got {x}");
    }
    if !(ms.is_finite() && ms > 0.0) {
        bail!("ms must be positive and finite, got {ms}");
    }
    Ok(())
}

pub(super) fn prefill_curve(points: &[PrefillPoint]) -> Result<Vec<(f64, f64)>> {
    ensure!(!points.is_empty(), "no points");
    let mut out = Vec::with_capacity(points.len());
    for p in points {
        check_point(p.tokens, p.ms, "tokens")?;
        out.push((p.tokens, p.ms));
    }
    sorted_unique(out)
}

pub(super) fn decode_rows(points: &[DecodePoint]) -> Result<Vec<DecodeRow>> {
    ensure!(!points.is_empty(), "no points");
    let mut by_ctx: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        check_point(p.batch, p.ms, "batch")?;
        check_point(p.context, p.ms, "context")?;
        // NOTE: f64 keys via their bits are exact here: contexts are integers in practice
        // and positive finite floats order the same as their bit patterns.
        by_ctx
            .entry(p.context.to_bits())
            .or_default()
            .push((p.batch, p.ms));
    }
    by_ctx
        .into_iter()
        .map(|(bits, pts)| {
            let context = f64::from_bits(bits);
            let points = sorted_unique(pts).with_context(|| format!("context {context}"))?;
            Ok(DecodeRow { context, points })
        })
        .collect()
}

fn sorted_unique(mut pts: Vec<(f64, f64)>) -> Result<Vec<(f64, f64)>> {
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in pts.windows(2) {
        ensure!(w[0].0 != w[1].0, "duplicate point at {}", w[0].0);
    }
    Ok(pts)
}

/// A prefill curve extrapolated linearly to zero tokens from its first two points, clamped
/// to `[0, first point]`.
pub(super) fn fixed_part(pts: &[(f64, f64)]) -> f64 {
    let (x0, y0) = pts[0];
    let Some(&(x1, y1)) = pts.get(1) else {
        return y0;
    };
    (y0 - x0 * (y1 - y0) / (x1 - x0)).clamp(0.0, y0)
}

/// Piecewise-linear interpolation over sorted `(x, y)`; holds the first value below the
/// first point, extrapolates the last segment past the last point (never below its start).
pub(super) fn interp(pts: &[(f64, f64)], x: f64) -> f64 {
    let i = pts.partition_point(|p| p.0 <= x);
    if i == 0 || pts.len() == 1 {
        return pts[0].1;
    }
    let (a, b) = if i == pts.len() {
        (pts[i - 2], pts[i - 1])
    } else {
        (pts[i - 1], pts[i])
    };
    let y = a.1 + (x - a.0) * (b.1 - a.1) / (b.0 - a.0);
    y.max(a.1.min(b.1))
}
