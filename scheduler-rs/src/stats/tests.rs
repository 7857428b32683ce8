//! Tests of the window statistics and the censored length estimates.

use super::*;

#[test]
fn quantiles_are_nearest_rank() {
    let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
    let s = LengthStats::of(&mut v);
    assert_eq!(
        (s.count, s.mean, s.p50, s.p90, s.p99),
        (100, 50.5, 50.0, 90.0, 99.0)
    );
    assert_eq!(LengthStats::of(&mut []), LengthStats::default());
}

#[test]
fn rate_and_lengths_slide_with_time() {
    let mut st = WindowStats::new(StatsConfig {
        rate_window_s: 1.0,
        length_window_s: 2.0,
        ..StatsConfig::default()
    });
    for (t, len) in [(0.1, 10), (0.5, 20), (1.2, 30), (1.4, 40)] {
        st.on_arrival(t, "a", len);
    }
    st.on_completion(1.0, "a", 7);
    st.on_arrival(1.0, "b", 5);
    let snap = st.snapshot(1.5, &[]);
    assert_eq!(snap.len(), 2);
    // Window (0.5, 1.5]: arrivals at 1.2 and 1.4 (0.5 sits on the cut and is excluded).
    assert_eq!(snap[0].tier, "a");
    assert_eq!(snap[0].rate_rps, 2.0);
    assert_eq!(snap[0].prompt.mean, 25.0);
    assert_eq!(snap[0].output.mean, 7.0);
    assert_eq!(snap[1].rate_rps, 1.0);
    // Everything expires: the rate drops to 0 but the last length shape is kept.
    let later = st.snapshot(10.0, &[]);
    assert_eq!(later[0].rate_rps, 0.0);
    assert_eq!(later[0].prompt.mean, 25.0);
    assert_eq!(later[0].output.p99, 7.0);
}

#[test]
fn recent_arrivals_list_tier_age_and_prompt_within_the_lookback() {
    let mut st = WindowStats::new(StatsConfig {
        length_window_s: 2.0,
        ..StatsConfig::default()
    });
    for (t, len) in [(0.1, 10), (1.2, 30), (1.4, 40)] {
        st.on_arrival(t, "a", len);
    }
    st.on_arrival(1.0, "b", 5);
    let r = st.recent_arrivals(1.5, 0.4);
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|x| x.0 == "a"));
    assert!((r[0].1 - 0.3).abs() < 1e-9 && r[0].2 == 30.0);
    assert!((r[1].1 - 0.1).abs() < 1e-9 && r[1].2 == 40.0);
    // The lookback is capped by the length window (2 s): 0.1 is older than that.
    assert_eq!(st.recent_arrivals(2.5, 60.0).len(), 3);
}

#[test]
fn running_requests_count_as_censored_output_samples() {
    let mut st = WindowStats::new(StatsConfig::default());
    st.on_arrival(0.0, "a", 10);
    // No completion yet: running requests say nothing (the planner's prior applies).
    let first = st.snapshot(0.5, &[("a", 3.0)]);
    assert_eq!((first[0].output.count, first[0].output.mean), (0, 0.0));
    st.on_completion(0.8, "a", 8);
    st.on_completion(0.9, "a", 12);
    let snap = st.snapshot(1.0, &[("a", 40.0), ("a", 2.0), ("b", 500.0)]);
    assert_eq!(snap[0].output.count, 4);
    assert_eq!(
        snap[0].output.mean,
        censored_mean(&[8.0, 12.0], &[40.0, 2.0], 256.0)
    );
    // Quantiles from the same survival curve: 1 up to 8, 2/3 up to 12, 1/3 from 12 on
    // (the run at 40 leaves it there); p90 and p99 lie in the memoryless tail past 40.
    assert_eq!(snap[0].output.p50, 12.0);
    let tail = |p: f64| 40.0 + 256.0 * ((1.0 / 3.0) / (1.0 - p)).ln();
    assert!((snap[0].output.p90 - tail(0.9)).abs() < 1e-9);
    assert!((snap[0].output.p99 - tail(0.99)).abs() < 1e-9);
}

#[test]
fn waiting_requests_do_not_drag_the_output_quantiles_to_zero() {
    // Under overload most requests in flight are still waiting (0 tokens): lower bounds
    // that say nothing. Counted as lengths they made the median 0.
    let waiting = vec![0.0; 50];
    let s = censored_stats(&[100.0, 200.0, 300.0], &waiting, 256.0);
    assert_eq!((s.count, s.p50, s.p90, s.p99), (53, 200.0, 300.0, 300.0));
    assert!((s.mean - 200.0).abs() < 1e-9);
}

#[test]
fn censored_mean_is_kaplan_meier_with_a_tail() {
    // Nothing running: the plain mean.
    assert_eq!(censored_mean(&[8.0, 12.0], &[], 256.0), 10.0);
    // Sorted: 2 (running), 8 (done), 12 (done), 40 (running). S = 1 up to 8 (the run at 2
    // only leaves the risk set), then 2/3 up to 12, then 1/3 up to 40 where the last one
    // is still running: 8 + 4·2/3 + 28·1/3 + 1/3·256 = 105.33.
    let m = censored_mean(&[8.0, 12.0], &[40.0, 2.0], 256.0);
    assert!(
        (m - (8.0 + 4.0 * 2.0 / 3.0 + 28.0 / 3.0 + 256.0 / 3.0)).abs() < 1e-9,
        "{m}"
    );
    // Running requests at most as long as the completed ones barely move it.
    let short = censored_mean(&[100.0; 9], &[1.0], 256.0);
    assert!((short - 100.0).abs() < 1e-9, "{short}");
}

#[test]
fn late_reports_land_in_time_order_and_leave_the_window_on_time() {
    // Another router's arrivals reach the leader late: inserted where they belong, they
    // count towards the rate exactly while their time is within the window.
    let mut w = WindowStats::new(StatsConfig {
        rate_window_s: 1.0,
        length_window_s: 10.0,
        ..StatsConfig::default()
    });
    w.on_arrival(5.0, "a", 100);
    w.insert_arrival(4.2, "a", 300);
    w.insert_arrival(5.5, "a", 200);
    w.insert_completion(4.5, "a", 7);
    assert_eq!(
        w.recent_arrivals(6.0, 10.0),
        [
            ("a", 1.7999999999999998, 300.0),
            ("a", 1.0, 100.0),
            ("a", 0.5, 200.0)
        ]
    );
    assert_eq!(w.recent_completions(6.0, 10.0), [("a", 1.5, 7.0)]);
    // The window (4.6, 5.6] holds 5.0 and 5.5; 4.2, inserted after 5.0, left it on time
    // (appended at the back it would have stayed behind 5.0).
    assert_eq!(w.snapshot(5.6, &[])[0].rate_rps, 2.0);
    assert_eq!(w.snapshot(6.2, &[])[0].rate_rps, 1.0);
    // A router that records but never plans (a follower) drops old samples by pruning.
    w.prune(16.0);
    assert_eq!(w.recent_arrivals(16.0, 100.0), []);
    assert_eq!(w.recent_completions(16.0, 100.0), []);
}
