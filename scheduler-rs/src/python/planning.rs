//! `nitsum._core.Profile`, `GroupPlan`, `Plan`, `plan()` and `default_tiers()`: the planner
//! (docs/planner.md) with typed values at the boundary. NOTE: the Rust types (`profile::
//! Profile`, `plan::NamedGroupPlan`, `plan::NamedPlan`) stay primary; a plan's tiers are
//! names here, as on every other wire.

use pyo3::prelude::*;

use super::error::value_error;
use super::planner_config::PyPlannerConfig;
use super::tier_classes::{PyTier, PyTierDemand};
use crate::plan::{NamedGroupPlan, NamedPlan, Role};
use crate::planner::PlannerConfig;
use crate::profile::Profile;
use crate::stats::TierDemand;
use crate::tiers::Tier;

/// A validated performance profile (`docs/profile-schema.md`), from the file's text.
/// Raises `ValueError` on an invalid one.
#[pyclass(frozen, name = "Profile", module = "nitsum._core")]
pub struct PyProfile {
    pub inner: Profile,
}

#[pymethods]
impl PyProfile {
    #[new]
    fn new(text: &str) -> PyResult<Self> {
        let inner = Profile::from_json(text).map_err(value_error)?;
        Ok(Self { inner })
    }

    #[getter]
    fn device(&self) -> &str {
        &self.inner.device
    }

    #[getter]
    fn model(&self) -> &str {
        &self.inner.model
    }

    /// TP levels the profile covers (pipeline depth 1), ascending.
    #[getter]
    fn tp_levels(&self) -> Vec<u32> {
        self.inner.tp_levels()
    }
}

/// One device group of a plan (`plan::GroupPlan`), its tiers by name. `role` is
/// `"prefill"`, `"decode"` or `"mixed"`.
#[pyclass(frozen, get_all, eq, name = "GroupPlan", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyGroupPlan {
    members: Vec<u32>,
    tp: u32,
    pp: u32,
    role: String,
    tiers: Vec<String>,
    accepts_background: bool,
    max_rps: f64,
    max_inflight: f64,
}

#[pymethods]
impl PyGroupPlan {
    #[new]
    #[pyo3(signature = (members, tp, role, tiers, accepts_background=false, max_rps=0.0,
        max_inflight=0.0, pp=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        members: Vec<u32>,
        tp: u32,
        role: String,
        tiers: Vec<String>,
        accepts_background: bool,
        max_rps: f64,
        max_inflight: f64,
        pp: u32,
    ) -> PyResult<Self> {
        role_of(&role)?;
        Ok(Self {
            members,
            tp,
            pp,
            role,
            tiers,
            accepts_background,
            max_rps,
            max_inflight,
        })
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

fn role_of(name: &str) -> PyResult<Role> {
    match name {
        "prefill" => Ok(Role::Prefill),
        "decode" => Ok(Role::Decode),
        "mixed" => Ok(Role::Mixed),
        _ => Err(value_error(anyhow::anyhow!(
            "plan: role must be prefill, decode or mixed, got {name:?}"
        ))),
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Mixed => "mixed",
    }
}

impl PyGroupPlan {
    fn to_rust(&self) -> PyResult<NamedGroupPlan> {
        Ok(NamedGroupPlan {
            members: self.members.clone(),
            tp: self.tp,
            pp: self.pp,
            role: role_of(&self.role)?,
            tiers: self.tiers.clone(),
            accepts_background: self.accepts_background,
            max_rps: self.max_rps,
            max_inflight: self.max_inflight,
        })
    }
}

impl From<NamedGroupPlan> for PyGroupPlan {
    fn from(g: NamedGroupPlan) -> Self {
        PyGroupPlan {
            role: role_name(g.role).to_string(),
            members: g.members,
            tp: g.tp,
            pp: g.pp,
            tiers: g.tiers,
            accepts_background: g.accepts_background,
            max_rps: g.max_rps,
            max_inflight: g.max_inflight,
        }
    }
}

/// A plan (`plan::Plan`): its epoch, its groups and, per group, the decode batch cap that
/// keeps its tier within TPOT (0: no cap; empty for a plan not made by `plan()`).
#[pyclass(frozen, get_all, eq, name = "Plan", module = "nitsum._core")]
#[derive(Debug, Clone, PartialEq)]
pub struct PyPlan {
    epoch: u64,
    groups: Vec<PyGroupPlan>,
    batch_caps: Vec<f64>,
}

#[pymethods]
impl PyPlan {
    #[new]
    #[pyo3(signature = (epoch, groups, batch_caps=Vec::new()))]
    fn new(epoch: u64, groups: Vec<PyGroupPlan>, batch_caps: Vec<f64>) -> Self {
        Self {
            epoch,
            groups,
            batch_caps,
        }
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl PyPlan {
    fn to_rust(&self) -> PyResult<NamedPlan> {
        Ok(NamedPlan {
            epoch: self.epoch,
            groups: self
                .groups
                .iter()
                .map(PyGroupPlan::to_rust)
                .collect::<PyResult<_>>()?,
        })
    }
}

/// One planner decision (docs/planner.md) for `num_devices` devices, after `previous` (its
/// tiers resolved by name against `tiers`), with the planner knobs `config` (None: the
/// defaults). Raises `ValueError` on invalid input.
#[pyfunction]
#[pyo3(signature = (profile, tiers, demand, num_devices, previous=None, config=None))]
pub fn plan(
    py: Python<'_>,
    profile: &PyProfile,
    tiers: Vec<PyTier>,
    demand: Vec<PyTierDemand>,
    num_devices: u32,
    previous: Option<PyPlan>,
    config: Option<PyPlannerConfig>,
) -> PyResult<PyPlan> {
    let tiers: Vec<Tier> = tiers.iter().map(Tier::from).collect();
    let demand: Vec<TierDemand> = demand.iter().map(TierDemand::from).collect();
    let previous = previous.as_ref().map(PyPlan::to_rust).transpose()?;
    let cfg = config.as_ref().map(PlannerConfig::from).unwrap_or_default();
    let (out, batch_caps) = py
        .detach(|| {
            crate::planner::plan_named(&profile.inner, &tiers, &demand, num_devices, previous, &cfg)
        })
        .map_err(value_error)?;
    Ok(PyPlan {
        epoch: out.epoch,
        groups: out.groups.into_iter().map(PyGroupPlan::from).collect(),
        batch_caps,
    })
}

/// The router's default tiers (`config::default_tiers`): `nitsum bench` uses the same ones,
/// so a benchmark without `--tier` measures what a default router plans for.
#[pyfunction]
pub fn default_tiers() -> Vec<PyTier> {
    crate::config::default_tiers()
        .into_iter()
        .map(PyTier::from)
        .collect()
}
