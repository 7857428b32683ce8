//! The order a simulated group gives prompt tokens in: class by class, first come first
//! served, except that short prompts overtake long ones that can spare the tokens. The
//! worker's local scheduler does the same (python/nitsum/engine/prompt_order.py, whose NOTE
//! gives the rule and why).

use crate::dispatch::Class;

use super::reqs::{queue_of, Reqs};

/// How prompts share an iteration's budget.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Prompt tokens per iteration.
    pub budget: u32,
    /// Seconds of an iteration with a full prompt budget.
    pub full_s: f64,
    /// When the next iteration starts.
    pub now: f64,
}

impl Pace {
    /// Tokens a long prompt `r` with `ahead` prompt tokens before it can let go first.
    fn spare(&self, reqs: &Reqs, r: usize, ahead: f64) -> f64 {
        let short_max = self.budget / 2;
        let deadline = reqs[r].deadline;
        if reqs[r].class == Class::Background || !deadline.is_finite() {
            return f64::from(self.budget - short_max);
        }
        let budget = f64::from(self.budget);
        let steps = ((deadline - self.now) / self.full_s).floor();
        (steps * budget - ahead - left(reqs, r)).max(0.0)
    }
}

fn left(reqs: &Reqs, r: usize) -> f64 {
    f64::from(reqs[r].input - reqs[r].prefilled)
}

/// Reorder `order` (sorted by class, FCFS within a class): within each class the short
/// prompts (at most half a budget left) that the long ones before them can spare go first.
/// `scratch` is reused storage.
pub fn overtake(order: &mut [usize], reqs: &Reqs, pace: Pace, scratch: &mut Vec<usize>) {
    let short_max = f64::from(pace.budget / 2);
    let mut higher = 0.0; // prompt tokens of the classes before this one
    let mut from = 0;
    while from < order.len() {
        let class = queue_of(reqs[order[from]].class);
        let to = from
            + order[from..]
                .iter()
                .take_while(|&&r| queue_of(reqs[r].class) == class)
                .count();
        let span = &mut order[from..to];
        scratch.clear();
        let mut room: Option<f64> = None;
        let mut ahead = 0.0;
        // First pass: the overtaking shorts, in order; second: the rest.
        let mut jumps = Vec::new();
        for (i, &r) in span.iter().enumerate() {
            let n = left(reqs, r);
            let before = ahead;
            ahead += n;
            let short = n <= short_max;
            match room {
                Some(space) if short && n <= space => {
                    room = Some(space - n);
                    jumps.push(i);
                    continue;
                }
                Some(_) if short => room = Some(0.0),
                _ => {}
            }
            if !short {
                let s = pace.spare(reqs, r, higher + before);
                room = Some(room.map_or(s, |space| space.min(s)));
            }
        }
        if !jumps.is_empty() {
            scratch.extend(jumps.iter().map(|&i| span[i]));
            let mut j = jumps.iter().peekable();
            for (i, &r) in span.iter().enumerate() {
                if j.peek() == Some(&&i) {
                    j.next();
                } else {
                    scratch.push(r);
                }
            }
            span.copy_from_slice(scratch);
        }
        higher += ahead;
        from = to;
    }
}
