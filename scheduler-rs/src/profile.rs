//! Offline performance profile (`docs/profile-schema.md`, schema `nitsum-profile/1`): loading,
//! validation and latency interpolation per TP level.
//!
//! Interpolation: prefill latency is piecewise linear in prompt tokens; decode step latency is
//! piecewise linear in batch within each profiled context row and linear between rows
//! (bilinear on the grid). Past the last point both extrapolate linearly from the last
//! segment; below the first point they hold the first value (a forward never gets cheaper
//! than its fixed overhead).

use std::collections::BTreeMap;

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

/// Schema tag every profile must carry.
pub const SCHEMA: &str = "nitsum-profile/1";

/// A group's parallel shape: `pp` pipeline stages of `tp` devices each (`pp` 1: a TP group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape {
    pub tp: u32,
    pub pp: u32,
}

impl Shape {
    /// Devices a group of this shape takes.
    pub fn devices(self) -> u32 {
        self.tp * self.pp
    }

    /// The profile's key: `"2"` for TP 2, `"2x2"` for two stages of TP 2.
    pub fn key(self) -> String {
        if self.pp == 1 {
            self.tp.to_string()
        } else {
            format!("{}x{}", self.tp, self.pp)
        }
    }

    /// Parse a `pipelines` key, `"TPxPP"`.
    fn parse(key: &str) -> Option<Self> {
        let (tp, pp) = key.split_once('x')?;
        let shape = Shape {
            tp: tp.parse().ok()?,
            pp: pp.parse().ok()?,
        };
        (shape.tp >= 1 && shape.pp >= 2).then_some(shape)
    }
}

impl From<u32> for Shape {
    fn from(tp: u32) -> Self {
        Shape { tp, pp: 1 }
    }
}

/// One prefill measurement: a forward over `tokens` prompt tokens took `ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefillPoint {
    pub tokens: f64,
    pub ms: f64,
}

/// One decode measurement: a step of `batch` sequences at `context` tokens each took `ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DecodePoint {
    pub batch: f64,
    pub context: f64,
    pub ms: f64,
}

/// The profile file as written by `nitsum profile` (unknown fields are ignored).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileFile {
    pub schema: String,
    pub device: String,
    pub model: String,
    #[serde(default)]
    pub dtype: String,
    #[serde(default)]
    pub analytic: bool,
    #[serde(default)]
    pub date: String,
    #[serde(default)]
    pub max_context: Option<f64>,
    pub tp_levels: Vec<u32>,
    pub prefill: BTreeMap<String, Vec<PrefillPoint>>,
    pub decode: BTreeMap<String, Vec<DecodePoint>>,
    /// The same points with the group run as sequence parallelism (levels ≥ 2, optional):
    /// a group shifts to SP when it batches many tokens, so its latency at a point is the
    /// better of the two modes (Shift Parallelism; `python/nitsum/parallel/shift.py`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sp_prefill: BTreeMap<String, Vec<PrefillPoint>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sp_decode: BTreeMap<String, Vec<DecodePoint>>,
    /// Batched tokens above which the runtime runs a group of that size as SP (`null`: TP
    /// only). With it, each point takes the mode the runtime picks there; without it, the
    /// faster of the two.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shift_threshold: BTreeMap<String, Option<f64>>,
    /// Pipelines measured (`"TPxPP"`: PP stages of TP devices), with their points keyed so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pipelines: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pp_prefill: BTreeMap<String, Vec<PrefillPoint>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pp_decode: BTreeMap<String, Vec<DecodePoint>>,
}

/// Decode points of one context value, sorted by batch.
#[derive(Debug, Clone)]
struct DecodeRow {
    context: f64,
    /// (batch, ms) sorted by batch.
    points: Vec<(f64, f64)>,
}

/// Validated curves of one TP level.
#[derive(Debug, Clone)]
struct Curves {
    /// (tokens, ms) sorted by tokens.
    prefill: Vec<(f64, f64)>,
    /// Rows sorted by context.
    decode: Vec<DecodeRow>,
    /// The prefill forward's fixed part (see [`Profile::prefill_fixed_ms`]).
    prefill_fixed_ms: f64,
}

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

    /// Parse and validate profile JSON text.
    pub fn from_json(text: &str) -> Result<Self> {
        let file: ProfileFile = serde_json::from_str(text).context("profile: invalid JSON")?;
        Self::from_file(file)
    }

    /// Load and validate a profile from a path.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("profile: cannot read {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("profile {}", path.display()))
    }

    /// Validate a parsed profile file.
    pub fn from_file(file: ProfileFile) -> Result<Self> {
        ensure!(
            file.schema == SCHEMA,
            "profile: schema is {:?}, expected {SCHEMA:?}",
            file.schema
        );
        ensure!(!file.tp_levels.is_empty(), "profile: tp_levels is empty");
        let mut levels = BTreeMap::new();
        for &tp in &file.tp_levels {
            ensure!(tp > 0, "profile: tp level 0 is not allowed");
            let key = tp.to_string();
            let prefill = file
                .prefill
                .get(&key)
                .with_context(|| format!("profile: no prefill points for tp {tp}"))?;
            let decode = file
                .decode
                .get(&key)
                .with_context(|| format!("profile: no decode points for tp {tp}"))?;
            let mut prefill = prefill_curve(prefill).with_context(|| format!("prefill tp {tp}"))?;
            let mut decode = decode_rows(decode).with_context(|| format!("decode tp {tp}"))?;
            // NOTE: the runtime picks SP when an iteration batches more tokens than the
            // group size's threshold; each point is planned in the mode it runs in (the
            // faster of the two when the profile gives no threshold).
            let mode = Shift::of(file.shift_threshold.get(&key));
            if let Some(sp) = file.sp_prefill.get(&key) {
                let sp = prefill_curve(sp).with_context(|| format!("sp_prefill tp {tp}"))?;
                prefill = mode.combine(&prefill, &sp);
            }
            if let Some(sp) = file.sp_decode.get(&key) {
                let sp = decode_rows(sp).with_context(|| format!("sp_decode tp {tp}"))?;
                for row in &mut decode {
                    for p in &mut row.points {
                        p.1 = mode.pick(p.0, p.1, rows_ms(&sp, p.0, row.context));
                    }
                }
            }
            let curves = Curves {
                prefill_fixed_ms: fixed_part(&prefill),
                prefill,
                decode,
            };
            levels.insert(Shape::from(tp), curves);
        }
        for key in file.sp_prefill.keys().chain(file.sp_decode.keys()) {
            ensure!(
                key != "1" && levels.keys().any(|s| s.key() == *key),
                "profile: SP points for level {key}, which is not a TP level >= 2 of the profile"
            );
        }
        for key in &file.pipelines {
            let shape = Shape::parse(key)
                .with_context(|| format!("profile: pipeline {key:?} is not \"TPxPP\", PP >= 2"))?;
            let prefill = file
                .pp_prefill
                .get(key)
                .with_context(|| format!("profile: no prefill points for pipeline {key}"))?;
            let decode = file
                .pp_decode
                .get(key)
                .with_context(|| format!("profile: no decode points for pipeline {key}"))?;
            let prefill = prefill_curve(prefill).with_context(|| format!("prefill {key}"))?;
            let curves = Curves {
                prefill_fixed_ms: fixed_part(&prefill),
                prefill,
                decode: decode_rows(decode).with_context(|| format!("decode {key}"))?,
            };
            levels.insert(shape, curves);
        }
        Ok(Profile {
            device: file.device.clone(),
            model: file.model.clone(),
            analytic: file.analytic,
            max_context: file.max_context,
            levels,
            file,
        })
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

/// Bilinear decode latency over rows sorted by context (see the module docs).
fn rows_ms(rows: &[DecodeRow], batch: f64, context: f64) -> f64 {
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

/// How a group of one size picks between TP and SP per iteration.
#[derive(Debug, Clone, Copy)]
enum Shift {
    /// SP above this many batched tokens.
    Above(f64),
    /// Never SP (the profile's threshold is null).
    TpOnly,
    /// No threshold given: the faster of the two at every point.
    Faster,
}

impl Shift {
    fn of(threshold: Option<&Option<f64>>) -> Self {
        match threshold {
            Some(Some(t)) => Shift::Above(*t),
            Some(None) => Shift::TpOnly,
            None => Shift::Faster,
        }
    }

    /// The latency at `tokens` batched tokens, given both modes' latencies there.
    fn pick(self, tokens: f64, tp_ms: f64, sp_ms: f64) -> f64 {
        match self {
            Shift::Above(t) if tokens > t => sp_ms,
            Shift::Above(_) | Shift::TpOnly => tp_ms,
            Shift::Faster => tp_ms.min(sp_ms),
        }
    }

    /// The curve the group runs, at the union of the two curves' points.
    fn combine(self, tp: &[(f64, f64)], sp: &[(f64, f64)]) -> Vec<(f64, f64)> {
        let mut xs: Vec<f64> = tp.iter().chain(sp).map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs.into_iter()
            .map(|x| (x, self.pick(x, interp(tp, x), interp(sp, x))))
            .collect()
    }
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

fn prefill_curve(points: &[PrefillPoint]) -> Result<Vec<(f64, f64)>> {
    ensure!(!points.is_empty(), "no points");
    let mut out = Vec::with_capacity(points.len());
    for p in points {
        check_point(p.tokens, p.ms, "tokens")?;
        out.push((p.tokens, p.ms));
    }
    sorted_unique(out)
}

fn decode_rows(points: &[DecodePoint]) -> Result<Vec<DecodeRow>> {
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
fn fixed_part(pts: &[(f64, f64)]) -> f64 {
    let (x0, y0) = pts[0];
    let Some(&(x1, y1)) = pts.get(1) else {
        return y0;
    };
    (y0 - x0 * (y1 - y0) / (x1 - x0)).clamp(0.0, y0)
}

/// Piecewise-linear interpolation over sorted `(x, y)`; holds the first value below the
/// first point, extrapolates the last segment past the last point (never below its start).
fn interp(pts: &[(f64, f64)], x: f64) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SAMPLE: &str = r#"{
      "schema": "nitsum-profile/1", "device": "test", "model": "m", "tp_levels": [1, 2],
      "prefill": {"1": [{"tokens": 100, "ms": 10}, {"tokens": 300, "ms": 30}],
                  "2": [{"tokens": 100, "ms": 6}]},
      "decode": {"1": [{"batch": 1, "context": 100, "ms": 5}, {"batch": 11, "context": 100, "ms": 15},
                       {"batch": 1, "context": 300, "ms": 7}, {"batch": 11, "context": 300, "ms": 27}],
                 "2": [{"batch": 1, "context": 100, "ms": 3}]}
    }"#;

    #[test]
    fn prefill_interpolates_holds_and_extrapolates() {
        let p = Profile::from_json(SAMPLE).unwrap();
        assert_eq!(p.tp_levels(), vec![1, 2]);
        assert_eq!(p.prefill_ms(1, 200.0), 20.0);
        assert_eq!(p.prefill_ms(1, 50.0), 10.0);
        assert_eq!(p.prefill_ms(1, 500.0), 50.0);
        assert_eq!(p.prefill_ms(2, 1000.0), 6.0);
        // (100, 10) and (300, 30) extrapolate to 0 ms at 0 tokens; one point: its value.
        assert_eq!(p.prefill_fixed_ms(1), 0.0);
        assert_eq!(p.prefill_extra_ms(1, 200.0), 20.0);
        assert_eq!(p.prefill_fixed_ms(2), 6.0);
        assert_eq!(p.prefill_extra_ms(2, 50.0), 0.0);
    }

    #[test]
    fn sp_points_make_each_point_the_faster_mode() {
        let mut file: ProfileFile = serde_json::from_str(SAMPLE).unwrap();
        // SP at TP 2: slower at 100 prompt tokens, faster at 400; decode faster at batch 1.
        file.sp_prefill.insert(
            "2".into(),
            vec![
                PrefillPoint {
                    tokens: 100.0,
                    ms: 8.0,
                },
                PrefillPoint {
                    tokens: 400.0,
                    ms: 12.0,
                },
            ],
        );
        file.sp_decode.insert(
            "2".into(),
            vec![DecodePoint {
                batch: 1.0,
                context: 100.0,
                ms: 2.0,
            }],
        );
        let p = Profile::from_file(file.clone()).unwrap();
        assert_eq!(p.prefill_ms(2, 100.0), 6.0); // TP wins
        assert_eq!(p.prefill_ms(2, 400.0), 6.0); // TP's single point holds at 6 < 12
        assert_eq!(p.decode_ms(2, 1.0, 100.0), 2.0); // SP wins
        assert_eq!(p.prefill_ms(1, 300.0), 30.0); // other levels untouched
                                                  // A round trip through the file keeps the SP points (the lookahead rebuilds from it).
        let again: ProfileFile =
            serde_json::from_str(&serde_json::to_string(p.file()).unwrap()).unwrap();
        assert_eq!(again.sp_decode["2"].len(), 1);
        // With the runtime's threshold, each point is the mode it runs in: SP above 50
        // tokens, so 100 prompt tokens run (and are planned) as SP even though TP is faster.
        let mut shifted = file.clone();
        shifted.shift_threshold.insert("2".into(), Some(50.0));
        let p = Profile::from_file(shifted.clone()).unwrap();
        assert_eq!(p.prefill_ms(2, 100.0), 8.0);
        assert_eq!(p.decode_ms(2, 1.0, 100.0), 3.0); // 1 token: TP
        shifted.shift_threshold.insert("2".into(), None); // TP only
        let p = Profile::from_file(shifted).unwrap();
        assert_eq!(p.decode_ms(2, 1.0, 100.0), 3.0);
        assert_eq!(p.prefill_ms(2, 100.0), 6.0);
        // SP at TP 1, or at a level the profile lacks, is refused.
        let mut bad = file;
        bad.sp_prefill.insert(
            "1".into(),
            vec![PrefillPoint {
                tokens: 1.0,
                ms: 1.0,
            }],
        );
        let e = format!("{:#}", Profile::from_file(bad).unwrap_err());
        assert!(e.contains("SP points for level 1"), "{e}");
    }

    #[test]
    fn pipelines_are_shapes_of_their_own() {
        let mut file: ProfileFile = serde_json::from_str(SAMPLE).unwrap();
        file.pipelines = vec!["1x2".into()];
        file.pp_prefill.insert(
            "1x2".into(),
            vec![PrefillPoint {
                tokens: 100.0,
                ms: 4.0,
            }],
        );
        file.pp_decode.insert(
            "1x2".into(),
            vec![DecodePoint {
                batch: 1.0,
                context: 100.0,
                ms: 2.5,
            }],
        );
        let p = Profile::from_file(file.clone()).unwrap();
        let pipe = Shape { tp: 1, pp: 2 };
        assert_eq!(p.prefill_ms(pipe, 100.0), 4.0);
        assert_eq!(p.decode_ms(pipe, 1.0, 100.0), 2.5);
        assert_eq!(p.decode_ms(2, 1.0, 100.0), 3.0); // TP 2, same devices: its own curve
        assert_eq!(p.tp_levels(), vec![1, 2]);
        assert_eq!(p.shapes(), vec![Shape::from(1), Shape::from(2), pipe]);
        assert_eq!((pipe.devices(), pipe.key()), (2, "1x2".to_string()));
        let mut bad = file.clone();
        bad.pipelines = vec!["2".into()];
        let e = format!("{:#}", Profile::from_file(bad).unwrap_err());
        assert!(e.contains("is not \"TPxPP\""), "{e}");
        let mut missing = file;
        missing.pp_decode.clear();
        let e = format!("{:#}", Profile::from_file(missing).unwrap_err());
        assert!(e.contains("no decode points for pipeline 1x2"), "{e}");
    }

    #[test]
    fn decode_is_bilinear() {
        let p = Profile::from_json(SAMPLE).unwrap();
        assert_eq!(p.decode_ms(1, 6.0, 100.0), 10.0);
        assert_eq!(p.decode_ms(1, 6.0, 300.0), 17.0);
        assert_eq!(p.decode_ms(1, 6.0, 200.0), 13.5);
        // Past the last context row: extrapolate from the last two rows (10 → 17 per 200).
        assert_eq!(p.decode_ms(1, 6.0, 500.0), 24.0);
        assert_eq!(p.decode_ms(1, 21.0, 100.0), 25.0);
        assert_eq!(p.max_batch(1), 11.0);
    }

    #[test]
    fn validation_errors_are_clear() {
        let bad_schema = SAMPLE.replace("nitsum-profile/1", "v0");
        let e = format!("{:#}", Profile::from_json(&bad_schema).unwrap_err());
        assert!(e.contains("schema"), "{e}");
        let missing = SAMPLE.replace("\"tp_levels\": [1, 2]", "\"tp_levels\": [1, 4]");
        let e = format!("{:#}", Profile::from_json(&missing).unwrap_err());
        assert!(e.contains("no prefill points for tp 4"), "{e}");
        let negative = SAMPLE.replace("\"ms\": 6}", "\"ms\": -6}");
        let e = format!("{:#}", Profile::from_json(&negative).unwrap_err());
        assert!(e.contains("prefill tp 2") && e.contains("positive"), "{e}");
        let dup = SAMPLE.replace("\"tokens\": 300", "\"tokens\": 100");
        assert!(format!("{:#}", Profile::from_json(&dup).unwrap_err()).contains("duplicate"));
    }
}
