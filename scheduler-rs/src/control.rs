//! The router's control loop (architecture §4 "Control loop"): every control window, window stats →
//! planner (with the previous plan) → diff → `reconfigure` to the workers → acks (bounded
//! wait) → routing switches to the new epoch only for an acknowledged plan. The engine side
//! (stats, rounds, history, metrics) is in `state/control.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::planner::strategy::{plan_strategy, Strategy};
use crate::planner::{self, PlannerConfig};
use crate::profile::Profile;
use crate::sim::chooser::Chooser;
use crate::sim::lookahead::{EngineKnobs, Situation};
use crate::state::{PlanRecord, PlanResult, RoundOutcome, RouterState};
use crate::stats::TierDemand;

/// Whether the "disaggregation off across domains" warning was logged.
static WARNED_DOMAINS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Most windows skipped after consecutive failed rounds.
pub const MAX_BACKOFF_WINDOWS: u32 = 32;

/// Run [`step`] every `control_window_ms` until aborted. After a refused or timed-out round
/// the loop backs off (1, 2, 4, ... up to [`MAX_BACKOFF_WINDOWS`] windows without planning;
/// reset by an applied round) so a worker that cannot take the plan is not asked again every
/// window. Window statistics keep accumulating meanwhile.
pub fn spawn(engine: Arc<RouterState>, profile: Arc<Profile>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let window = Duration::from_millis(engine.cfg.control_window_ms);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
        // NOTE: a round may wait for acks longer than a window; skip the windows it covered.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut backoff, mut skip) = (0u32, 0u32);
        let lookahead = engine.cfg.lookahead.clone();
        let mut chooser = lookahead
            .enabled
            .then(|| Chooser::new(lookahead, Strategy::Greedy));
        loop {
            tick.tick().await;
            if skip > 0 {
                skip -= 1;
                continue;
            }
            match step(&engine, &profile, &mut chooser)
                .await
                .map(|r| r.result)
            {
                Some(PlanResult::Applied) => backoff = 0,
                Some(_) => {
                    backoff = (backoff * 2).clamp(1, MAX_BACKOFF_WINDOWS);
                    skip = backoff;
                }
                None => {}
            }
        }
    })
}

/// One control window: choose the layout strategy (when `chooser` runs, every
/// `every_windows`), plan with it, and when the plan differs from the current one, run a
/// reconfigure round and wait for its acks (at most `reconfigure_timeout_ms`). Returns the
/// round's record, or `None` when there was nothing to change (or no workers).
pub async fn step(
    engine: &RouterState,
    profile: &Arc<Profile>,
    chooser: &mut Option<Chooser>,
) -> Option<PlanRecord> {
    let view = engine.planning_view();
    if view.devices == 0 {
        return None;
    }
    engine.release_late_charges();
    let demand = engine.demand_snapshot();
    let mut cfg = engine.cfg.planner.clone();
    // TP levels: those every worker registered, within the operator's allowed set.
    cfg.tp_levels = Some(match cfg.tp_levels.take() {
        Some(allowed) => view
            .tp_levels
            .iter()
            .copied()
            .filter(|t| allowed.contains(t))
            .collect(),
        None => view.tp_levels.clone(),
    });
    if !view.single_domain && cfg.disaggregation {
        // NOTE: KV moves only inside one host worker process; a prefill group in one and its
        // decode group in another would decode the request itself, off the plan.
        cfg.disaggregation = false;
        if !WARNED_DOMAINS.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                "control: workers span several host worker processes; prefill/decode \
                 disaggregation is off (no KV transport between processes yet)"
            );
        }
    }
    let t0 = Instant::now();
    let window = engine.next_control_window();
    let every = u64::from(engine.cfg.lookahead.every_windows.max(1));
    let strategy = match chooser.take() {
        Some(c) if !window.is_multiple_of(every) => {
            let strategy = c.current();
            *chooser = Some(c);
            strategy
        }
        Some(c) => {
            let levels = planner::candidate_levels(profile, &cfg, view.devices);
            let (c, strategy) =
                choose(engine, profile, c, &demand, &levels, view.devices, &cfg).await;
            *chooser = Some(c);
            strategy
        }
        None => Strategy::Greedy,
    };
    let planned = plan_strategy(
        strategy,
        profile,
        &engine.cfg.tiers,
        &demand,
        view.devices,
        Some(&view.current),
        &cfg,
    );
    let plan_ms = t0.elapsed().as_secs_f64() * 1e3;
    if planned.plan.groups.is_empty()
        || planned.plan.groups == view.current.groups
        || engine.refresh_capacities(&planned.plan.groups, &planned.batch_caps)
    {
        return None;
    }
    let (epoch, acks) =
        engine.begin_round(planned.plan.groups, planned.batch_caps, demand, plan_ms);
    let wait = Duration::from_millis(engine.cfg.reconfigure_timeout_ms);
    let outcome = match tokio::time::timeout(wait, acks).await {
        Ok(Ok(())) => RoundOutcome::Answered,
        Ok(Err(_)) | Err(_) => RoundOutcome::TimedOut,
    };
    engine.end_round(epoch, outcome)
}

/// One selection round off the async threads (it simulates every candidate: tens of ms).
async fn choose(
    engine: &RouterState,
    profile: &Arc<Profile>,
    mut chooser: Chooser,
    demand: &[TierDemand],
    levels: &[u32],
    devices: u32,
    cfg: &PlannerConfig,
) -> (Chooser, Strategy) {
    let (profile, tiers) = (profile.clone(), engine.cfg.tiers.clone());
    let (demand, levels, cfg) = (demand.to_vec(), levels.to_vec(), cfg.clone());
    let inflight = engine.inflight_snapshot();
    let (recent, history_s) = engine.recent_arrivals(chooser.cfg.lookback_s());
    // What the lookahead checks its predictions against: completions of the last minute.
    let (now, outcomes) = engine.recent_outcomes(60.0);
    let weights: Vec<f64> = tiers
        .iter()
        .map(|t| if t.background { 0.0 } else { t.weight })
        .collect();
    let run = tokio::task::spawn_blocking(move || {
        let delivered = |t0: f64, t1: f64| {
            let met: f64 = outcomes
                .iter()
                .filter(|o| o.0 >= t0 && o.0 < t1 && o.2)
                .map(|o| weights[o.1])
                .sum();
            met / (t1 - t0).max(1e-9)
        };
        let situation = Situation {
            profile: &profile,
            tiers: &tiers,
            demand: &demand,
            inflight: &inflight,
            recent: &recent,
            history_s,
            devices,
            levels: &levels,
            planner: &cfg,
            knobs: EngineKnobs::default(),
        };
        let choice = chooser.round(&situation, now, &delivered);
        (chooser, choice)
    });
    match run.await {
        Ok((chooser, choice)) => {
            let strategy = choice.chosen;
            tracing::info!(strategy = %strategy.name(), reason = %choice.reason, "control: strategy");
            engine.set_choice(choice);
            (chooser, strategy)
        }
        // NOTE: a panicking round loses the chooser's averages; the greedy carries on.
        Err(_) => (
            Chooser::new(engine.cfg.lookahead.clone(), Strategy::Greedy),
            Strategy::Greedy,
        ),
    }
}

/// Load the profile named by the config, if any (validated).
pub fn load_profile(cfg: &crate::config::RouterConfig) -> anyhow::Result<Option<Arc<Profile>>> {
    cfg.profile
        .as_deref()
        .map(|p| Profile::load(p).map(Arc::new))
        .transpose()
}
