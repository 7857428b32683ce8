//! Offline performance profile (`docs/profile-schema.md`, schema `nitsum-profile/1`): loading,
//! validation and latency interpolation per TP level.
//!
//! Interpolation: prefill latency is piecewise linear in prompt tokens; decode step latency is
//! piecewise linear in batch within each profiled context row and linear between rows
//! (bilinear on the grid). Past the last point both extrapolate linearly from the last
//! segment; below the first point they hold the first value (a forward never gets cheaper
//! than its fixed overhead).

mod curves;
mod load;
mod profile_file;
mod shape;
mod shift;

use std::collections::BTreeMap;

pub use profile_file::{DecodePoint, PrefillPoint, ProfileFile, SCHEMA};
pub use shape::Shape;

use curves::{interp, rows_ms, Curves};

/// A validated profile, ready to interpolate.
#[derive(Debug, Clone)]
pub struct Profile {
    pub device: String,
    pub model: String,
    pub analytic: bool,
    pub max_context: Option<f64>,
    /// TP levels (pp 1) and pipelines.
    levels: BTreeMap<Shape, Curves>,
    /// The validated file (the lookahead's simulations are configured with it).
    file: ProfileFile,
}

impl Profile {
    /// The validated profile file.
    pub fn file(&self) -> &ProfileFile {
        &self.file
    }

    /// TP levels the profile covers, ascending.
    pub fn tp_levels(&self) -> Vec<u32> {
        self.levels
            .keys()
            .filter(|s| s.pp == 1)
            .map(|s| s.tp)
            .collect()
    }

    /// Every shape the profile covers (TP levels and pipelines), by devices, then depth.
    pub fn shapes(&self) -> Vec<Shape> {
        let mut out: Vec<Shape> = self.levels.keys().copied().collect();
        out.sort_by_key(|s| (s.devices(), s.pp));
        out
    }

    pub fn has_tp(&self, tp: u32) -> bool {
        self.levels.contains_key(&Shape::from(tp))
    }

    /// Latency (ms) of one prefill forward over `tokens` prompt tokens in a group of `shape`
    /// (a TP level or a pipeline). Panics if the profile lacks it (callers pick from
    /// `shapes` or `tp_levels`).
    pub fn prefill_ms(&self, shape: impl Into<Shape>, tokens: f64) -> f64 {
        interp(&self.levels[&shape.into()].prefill, tokens)
    }

    /// Fixed part of a prefill forward: the curve extrapolated linearly to zero tokens from
    /// its first two points, clamped to `[0, first point]`. On a GPU this is mostly the weight
    /// read, which a mixed iteration pays once for decode and prefill.
    pub fn prefill_fixed_ms(&self, shape: impl Into<Shape>) -> f64 {
        self.levels[&shape.into()].prefill_fixed_ms
    }

    /// Extra latency (ms) of `tokens` prompt tokens riding in a decode iteration:
    /// `prefill_ms − prefill_fixed_ms` (the decode step already pays the fixed part).
    pub fn prefill_extra_ms(&self, shape: impl Into<Shape>, tokens: f64) -> f64 {
        if tokens <= 0.0 {
            return 0.0;
        }
        // NOTE: the simulator's hottest call (prompt chunk sizing): one level lookup.
        let curves = &self.levels[&shape.into()];
        (interp(&curves.prefill, tokens) - curves.prefill_fixed_ms).max(0.0)
    }

    /// Latency (ms) of one decode step of `batch` sequences at `context` tokens.
    /// NOTE: a pipeline's measured step includes its bubbles and stage hand-offs (one
    /// micro-batch per stage), so nothing is added for them here.
    pub fn decode_ms(&self, shape: impl Into<Shape>, batch: f64, context: f64) -> f64 {
        rows_ms(&self.levels[&shape.into()].decode, batch, context)
    }

    /// Largest profiled decode batch: the planner does not extrapolate past it.
    pub fn max_batch(&self, shape: impl Into<Shape>) -> f64 {
        self.levels[&shape.into()]
            .decode
            .iter()
            .flat_map(|r| r.points.iter().map(|p| p.0))
            .fold(1.0, f64::max)
    }
}

#[cfg(test)]
mod tests;
