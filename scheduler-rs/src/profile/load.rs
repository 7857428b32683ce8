//! Loading and validating a profile: JSON text or a path into a [`Profile`], TP levels with
//! their SP points folded in, and pipelines.

use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};

use super::curves::{decode_rows, fixed_part, prefill_curve, rows_ms, Curves};
use super::shift::Shift;
use super::{Profile, ProfileFile, Shape, SCHEMA};

impl Profile {
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
}
