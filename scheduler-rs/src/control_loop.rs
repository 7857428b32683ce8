//! The router's control loop (architecture §4 "Control loop"): every control window, window stats →
//! planner (with the previous plan) → diff → `reconfigure` to the workers → acks (bounded
//! wait) → routing switches to the new epoch only for an acknowledged plan. The engine side
//! (stats, rounds, history, metrics) is in `state/rounds/`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::planner::strategy::{plan_strategy, Strategy};
use crate::planner::{self, PlannerConfig};
use crate::profile::Profile;
use crate::sim::chooser::Chooser;
use crate::sim::forecast::{InFlight, RecentArrival};
use crate::sim::lookahead::{ChoiceKind, EngineKnobs, LookaheadConfig, Situation};
use crate::state::{PlanRecord, PlanResult, PlanningView, RoundOutcome, RouterState};
use crate::stats::TierDemand;

/// Whether the "disaggregation off across domains" warning was logged.
static WARNED_DOMAINS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Times a window the shadow choice's shadows are run between rounds.
const OBSERVE_PER_WINDOW: u32 = 10;

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
        let shadows = lookahead.enabled && lookahead.choice == ChoiceKind::Shadow;
        let mut chooser = lookahead
            .enabled
            .then(|| Chooser::new(lookahead, Strategy::Greedy));
        // NOTE: the shadow choice runs its shadows between rounds (`OBSERVE_PER_WINDOW` times
        // a window), so that a round only has the last stretch of the window left to run.
        let every = window / OBSERVE_PER_WINDOW;
        let mut observe_tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        observe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                // NOTE: this router just took the lease (several routers): plan at once.
                _ = engine.leading.notified() => (backoff, skip) = (0, 0),
                _ = tick.tick() => {}
                _ = observe_tick.tick(), if shadows => {
                    if engine.plans() {
                        observe(&engine, &profile, &mut chooser).await;
                    }
                    continue;
                }
            }
            // NOTE: a follower routes by the leader's plan; it plans once it leads. Its own
            // dispatcher still lets go of the charges of requests past their TTFT, and its
            // window drops what it no longer holds (it forwards its arrivals to the leader).
            if !engine.plans() {
                engine.release_late_charges();
                engine.prune_window();
                continue;
            }
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
    let cfg = planner_config(engine, &view);
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
            let (c, strategy) = choose(engine, profile, c, &demand, view.devices, &cfg).await;
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

/// The planner settings for the pool in `view`: the TP levels every worker registered
/// within the operator's allowed set, and no disaggregation across host worker processes
/// that share no KV transport.
fn planner_config(engine: &RouterState, view: &PlanningView) -> PlannerConfig {
    let cfg = engine.cfg.planner.for_pool(&view.tp_levels, view.kv_linked);
    if engine.cfg.planner.disaggregation
        && !cfg.disaggregation
        && !WARNED_DOMAINS.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::warn!(
            "control: workers span several host worker processes without one KV transport \
             (--kv-peers); prefill/decode disaggregation is off"
        );
    }
    cfg
}

/// What a selection round (or an observation between rounds) looks at, owned so that it
/// can move to a blocking thread.
struct Inputs {
    profile: Arc<Profile>,
    tiers: Vec<crate::tiers::Tier>,
    demand: Vec<TierDemand>,
    levels: Vec<u32>,
    cfg: PlannerConfig,
    inflight: Vec<InFlight>,
    recent: Vec<RecentArrival>,
    history_s: f64,
    devices: u32,
    knobs: EngineKnobs,
}

impl Inputs {
    fn gather(
        engine: &RouterState,
        profile: &Arc<Profile>,
        demand: Vec<TierDemand>,
        cfg: PlannerConfig,
        devices: u32,
        chooser: &LookaheadConfig,
    ) -> Self {
        let (recent, history_s) = engine.recent_arrivals(chooser.lookback_s());
        // Only the forecast re-creates the requests in flight (shadows run the arrivals).
        let inflight = match chooser.choice {
            ChoiceKind::Forecast => engine.inflight_snapshot(),
            ChoiceKind::Shadow => Vec::new(),
        };
        Inputs {
            profile: profile.clone(),
            tiers: engine.cfg.tiers.clone(),
            demand,
            levels: planner::candidate_levels(profile, &cfg, devices),
            cfg,
            inflight,
            recent,
            history_s,
            devices,
            knobs: EngineKnobs {
                window_s: engine.cfg.control_window_ms as f64 / 1e3,
                ..EngineKnobs::default()
            },
        }
    }

    fn situation(&self) -> Situation<'_> {
        Situation {
            profile: &self.profile,
            tiers: &self.tiers,
            demand: &self.demand,
            inflight: &self.inflight,
            recent: &self.recent,
            history_s: self.history_s,
            devices: self.devices,
            levels: &self.levels,
            planner: &self.cfg,
            knobs: self.knobs,
        }
    }
}

/// Between rounds: run the shadow choice's shadows to now, on a blocking thread.
async fn observe(engine: &RouterState, profile: &Arc<Profile>, chooser: &mut Option<Chooser>) {
    let view = engine.planning_view();
    let Some(mut c) = chooser.take() else {
        return;
    };
    if view.devices == 0 {
        *chooser = Some(c);
        return;
    }
    let cfg = planner_config(engine, &view);
    let inputs = Inputs::gather(
        engine,
        profile,
        engine.demand_snapshot(),
        cfg,
        view.devices,
        &c.cfg,
    );
    let now = inputs.history_s;
    let run = tokio::task::spawn_blocking(move || {
        c.observe(&inputs.situation(), now);
        c
    });
    // NOTE: a panicking observation loses the chooser's state; the greedy carries on.
    *chooser = Some(
        run.await
            .unwrap_or_else(|_| Chooser::new(engine.cfg.lookahead.clone(), Strategy::Greedy)),
    );
}

/// One selection round off the async threads (it simulates every candidate: tens of ms).
async fn choose(
    engine: &RouterState,
    profile: &Arc<Profile>,
    mut chooser: Chooser,
    demand: &[TierDemand],
    devices: u32,
    cfg: &PlannerConfig,
) -> (Chooser, Strategy) {
    let inputs = Inputs::gather(
        engine,
        profile,
        demand.to_vec(),
        cfg.clone(),
        devices,
        &chooser.cfg,
    );
    // What the lookahead checks its predictions against: completions of the last minute.
    let (now, outcomes) = engine.recent_outcomes(60.0);
    let weights: Vec<f64> = inputs
        .tiers
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
        let choice = chooser.round(&inputs.situation(), now, &delivered);
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
