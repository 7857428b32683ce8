//! Tests of the lookahead's workload forecast: rates, lengths, thinning and replay.

use super::*;
use crate::stats::LengthStats;

fn tier(name: &str) -> Tier {
    serde_json::from_str(&format!(
        r#"{{"name": "{name}", "ttft_ms": 100, "tpot_ms": 20}}"#
    ))
    .unwrap()
}

fn demand(name: &str, rate: f64, prompt: f64, output: f64) -> TierDemand {
    let stats = |m: f64| LengthStats {
        count: 100,
        mean: m,
        p50: m * 0.6,
        p90: m * 2.0,
        p99: m * 5.0,
    };
    TierDemand {
        tier: name.into(),
        rate_rps: rate,
        prompt: stats(prompt),
        output: stats(output),
    }
}

#[test]
fn forecast_keeps_rate_mean_lengths_and_thins_the_pool() {
    let tiers = [tier("a"), tier("b")];
    let d = [
        demand("a", 400.0, 1000.0, 200.0),
        demand("b", 100.0, 50.0, 20.0),
    ];
    let inflight: Vec<InFlight> = (0..80)
        .map(|k| InFlight {
            tier: k % 2,
            generated: if k < 40 { 0.0 } else { 30.0 },
            age_s: 0.0,
            feasible: k < 40, // the decoding ones were demoted
        })
        .collect();
    let spec = ForecastSpec {
        horizon_s: 10.0,
        rate_factor: 1.0,
        replay: false,
        history_s: f64::INFINITY,
        scale: 0.25,
        prior_lengths: (1024.0, 256.0),
        seed: 1,
    };
    let f = forecast(&tiers, &d, &inflight, &[], &spec);
    assert_eq!(
        f,
        forecast(&tiers, &d, &inflight, &[], &spec),
        "deterministic"
    );
    let arrivals = |t: &str| -> Vec<&TraceRequest> {
        f.iter()
            .filter(|r| r.tier == t && r.arrival_s > 0.0)
            .collect()
    };
    // 400 rps × 0.25 × 10 s = 1000 arrivals (Poisson: within 10%), lengths at the mean.
    let a = arrivals("a");
    assert!((900..1100).contains(&a.len()), "{}", a.len());
    let mean_in = a.iter().map(|r| f64::from(r.input_len)).sum::<f64>() / a.len() as f64;
    assert!((mean_in - 1000.0).abs() < 5.0, "{mean_in}");
    assert!(a.iter().all(|r| r.arrival_s < 10.0));
    assert!((200..300).contains(&arrivals("b").len()));
    // 80 in flight, a quarter kept: 10 waiting (fresh prompts), 10 decoding (1-token
    // prompt, 200 - 30 = 170 tokens left for tier a).
    let now: Vec<_> = f.iter().filter(|r| r.arrival_s == 0.0).collect();
    assert_eq!(now.len(), 20);
    assert_eq!(now.iter().filter(|r| r.input_len == 1).count(), 10);
    assert!(now
        .iter()
        .any(|r| r.tier == "a" && r.input_len == 1 && r.output_len == 170));
    // The decoding ones held no SLO bandwidth: they come back as leftover work.
    assert!(now.iter().all(|r| r.leftover == (r.input_len == 1)));
    assert!(f.iter().filter(|r| r.arrival_s > 0.0).all(|r| !r.leftover));
}

#[test]
fn replay_keeps_recent_times_and_prompts_compressed_by_the_rate_factor_and_thinned() {
    let tiers = [tier("a"), tier("b")];
    let d = [demand("a", 1.0, 100.0, 50.0), demand("b", 1.0, 100.0, 50.0)];
    // Tier a: one arrival every 0.1 s over the last 20 s, prompt = 10 × its index.
    let recent: Vec<RecentArrival> = (0..200)
        .map(|k| RecentArrival {
            tier: 0,
            age_s: 20.0 - 0.1 * f64::from(k),
            prompt: 10.0 * f64::from(k + 1),
        })
        .collect();
    let spec = ForecastSpec {
        horizon_s: 5.0,
        rate_factor: 2.0,
        replay: true,
        history_s: f64::INFINITY,
        scale: 0.5,
        prior_lengths: (1024.0, 256.0),
        seed: 1,
    };
    let f = forecast(&tiers, &d, &[], &recent, &spec);
    // The last 10 s (ages ≤ 10: 101 arrivals) compressed into 5 s, every other one kept.
    assert!(
        f.iter().all(|r| r.tier == "a"),
        "b replays nothing: none arrived"
    );
    assert_eq!(f.len(), 50);
    assert!(f.iter().all(|r| (0.0..5.0).contains(&r.arrival_s)));
    // Arrival at age a replays at (10 - a) / 2 with its own prompt (a = 20 - 0.1 k).
    for r in &f {
        let k = (f64::from(r.input_len) / 10.0).round() - 1.0;
        let at = (10.0 - (20.0 - 0.1 * k)) / 2.0;
        assert!((r.arrival_s - at).abs() < 1e-9, "{} vs {at}", r.arrival_s);
    }
    let poisson = ForecastSpec {
        replay: false,
        ..spec
    };
    assert!(
        forecast(&tiers, &d, &[], &recent, &poisson)
            .iter()
            .any(|r| r.tier == "b"),
        "without replay tier b arrives at its rate"
    );
}

#[test]
fn a_replay_longer_than_the_history_repeats_it_at_the_observed_rate() {
    let tiers = [tier("a")];
    let d = [demand("a", 1.0, 100.0, 50.0)];
    // 2 s of history, one arrival every 0.25 s: 4 req/s.
    let recent: Vec<RecentArrival> = (0..8)
        .map(|k| RecentArrival {
            tier: 0,
            age_s: 2.0 - 0.25 * f64::from(k),
            prompt: f64::from(k + 1),
        })
        .collect();
    let spec = ForecastSpec {
        horizon_s: 6.0,
        rate_factor: 1.0,
        replay: true,
        history_s: 2.0,
        scale: 1.0,
        prior_lengths: (1024.0, 256.0),
        seed: 1,
    };
    let f = forecast(&tiers, &d, &[], &recent, &spec);
    // 6 s at 4 req/s, the 2 s repeated three times in order.
    assert_eq!(f.len(), 24);
    let prompts: Vec<u32> = f.iter().map(|r| r.input_len).collect();
    assert_eq!(prompts[..8], prompts[8..16]);
    assert_eq!(prompts[..8], prompts[16..]);
    assert!((f[8].arrival_s - f[0].arrival_s - 2.0).abs() < 1e-9);
    // With a long history the same arrivals are replayed once (the rest of the 6 s is
    // empty: nothing arrived before).
    let long = ForecastSpec {
        history_s: 60.0,
        ..spec
    };
    assert_eq!(forecast(&tiers, &d, &[], &recent, &long).len(), 8);
}

#[test]
fn unseen_lengths_take_the_prior() {
    let tiers = [tier("a")];
    let mut d = demand("a", 10.0, 0.0, 0.0);
    d.prompt = LengthStats::default();
    d.output = LengthStats::default();
    let spec = ForecastSpec {
        horizon_s: 5.0,
        rate_factor: 1.0,
        replay: false,
        history_s: f64::INFINITY,
        scale: 1.0,
        prior_lengths: (300.0, 40.0),
        seed: 1,
    };
    let f = forecast(&tiers, &[d], &[], &[], &spec);
    assert!(!f.is_empty());
    assert!(f.iter().all(|r| r.input_len == 300 && r.output_len == 40));
}
