//! Rate-limited logging of refused `register`s (issue 29): a peer can send thousands per
//! second, and one WARN line each let it fill the router's log (5,000 wrote 775 KB in 2 s).
//!
//! The first [`LOGGED_PER_WINDOW`] refusals of each [`WINDOW`] are logged one by one; the rest
//! are summed up in one line ("N failed registers in the last T s ...") when the window ends.
//! NOTE: this only thins the log: `nitsum_worker_plane_rejected_total` counts every refusal.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::sessions::ConnId;
use crate::ids::WorkerId;

/// Refusals logged one by one per window.
pub const LOGGED_PER_WINDOW: u32 = 5;
/// The summary period.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Distinct connections (and worker ids) a summary tells apart; more are only counted.
const MAX_TRACKED: usize = 1024;

/// The refusals of one window beyond the first few.
#[derive(Debug, Default)]
struct Window {
    start: Option<Instant>,
    logged: u32,
    suppressed: u64,
    by_reason: BTreeMap<&'static str, u64>,
    conns: HashSet<ConnId>,
    more_conns: bool,
    workers: BTreeSet<u32>,
}

/// Decides which refusals are logged and writes the summaries.
#[derive(Debug, Default)]
pub struct RefusalLog {
    window: Mutex<Window>,
}

impl RefusalLog {
    /// Note one refusal at `now` for `reason` (a `Rejection` label). Returns (log this one?,
    /// the previous window's summary when that window just ended).
    pub fn note(
        &self,
        now: Instant,
        reason: &'static str,
        conn: &ConnId,
        worker: WorkerId,
    ) -> (bool, Option<String>) {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let summary = roll(&mut w, now);
        if w.logged < LOGGED_PER_WINDOW {
            w.logged += 1;
            return (true, summary);
        }
        w.suppressed += 1;
        *w.by_reason.entry(reason).or_default() += 1;
        if w.conns.len() < MAX_TRACKED {
            w.conns.insert(conn.clone());
        } else if !w.conns.contains(conn) {
            w.more_conns = true;
        }
        if w.workers.len() < MAX_TRACKED {
            w.workers.insert(worker.0);
        }
        (false, summary)
    }

    /// The summary of a window that ended by `now` (called periodically, so a burst's summary
    /// is written even when no refusal follows it).
    pub fn flush(&self, now: Instant) -> Option<String> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        match w.start {
            Some(start) if now.saturating_duration_since(start) >= WINDOW => roll(&mut w, now),
            _ => None,
        }
    }
}

/// Start a new window at `now` when there is none or the current one is over; the summary of
/// the one that ended, when it suppressed anything.
fn roll(w: &mut Window, now: Instant) -> Option<String> {
    let start = match w.start {
        Some(start) if now.saturating_duration_since(start) < WINDOW => return None,
        Some(start) => start,
        None => {
            w.start = Some(now);
            return None;
        }
    };
    let old = std::mem::replace(
        w,
        Window {
            start: Some(now),
            ..Window::default()
        },
    );
    (old.suppressed > 0).then(|| {
        let reasons: Vec<String> = old
            .by_reason
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        let ids: Vec<String> = old.workers.iter().map(u32::to_string).collect();
        format!(
            "{} more failed registers in the last {:.0} s (not logged one by one; {}) from {}{} \
             connections, for worker ids [{}]",
            old.suppressed,
            now.saturating_duration_since(start).as_secs_f64(),
            reasons.join(", "),
            old.conns.len(),
            if old.more_conns { "+" } else { "" },
            ids.join(", "),
        )
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn conn(i: usize) -> ConnId {
        Bytes::from(format!("c{i}"))
    }

    #[test]
    fn a_burst_logs_the_first_few_then_one_summary() {
        let log = RefusalLog::default();
        let t0 = Instant::now();
        let mut logged = 0;
        for i in 0..5_000 {
            let why = if i % 2 == 0 {
                "bad_proof"
            } else {
                "wrong_model"
            };
            let (one, summary) = log.note(t0, why, &conn(i % 7), WorkerId(i as u32 % 3));
            logged += usize::from(one);
            assert_eq!(summary, None);
        }
        assert_eq!(logged, LOGGED_PER_WINDOW as usize);
        assert_eq!(log.flush(t0 + WINDOW / 2), None, "the window is not over");
        let summary = log
            .flush(t0 + WINDOW)
            .expect("a summary when the window ends");
        assert!(
            summary.starts_with("4995 more failed registers in the last 10 s"),
            "{summary}"
        );
        assert!(
            summary.contains("bad_proof: 2497, wrong_model: 2498"),
            "{summary}"
        );
        assert!(
            summary.contains("from 7 connections, for worker ids [0, 1, 2]"),
            "{summary}"
        );
        assert_eq!(log.flush(t0 + 2 * WINDOW), None, "nothing to sum up twice");
    }

    #[test]
    fn a_new_window_logs_again_and_a_quiet_one_writes_no_summary() {
        let log = RefusalLog::default();
        let t0 = Instant::now();
        for _ in 0..LOGGED_PER_WINDOW {
            assert_eq!(
                log.note(t0, "bad_proof", &conn(0), WorkerId(1)),
                (true, None)
            );
        }
        assert!(!log.note(t0, "bad_proof", &conn(0), WorkerId(1)).0);
        // The next refusal after the window both logs and carries the summary.
        let (one, summary) = log.note(t0 + WINDOW, "id_taken", &conn(1), WorkerId(2));
        assert!(one);
        assert!(summary.unwrap().starts_with("1 more failed registers"));
        assert_eq!(
            log.flush(t0 + 3 * WINDOW),
            None,
            "no refusal was suppressed"
        );
    }
}
