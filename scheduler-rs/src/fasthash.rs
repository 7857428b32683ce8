//! A fast hasher for the router's integer keys (worker ids, request ids).
//!
//! SipHash (std's default) guards against hash flooding by untrusted keys; these keys are
//! chosen by the router itself, and hashing them sits on the per-request hot path (the
//! dispatcher scans every group per request), so a multiplicative hash is used instead.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing of integer keys: spreads sequential ids over all bits, high bits
/// included (hashbrown uses the top 7 bits as its control byte).
#[derive(Debug, Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by integer keys; a simple fold keeps it correct for anything else.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` keyed by router-chosen integers.
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_map_works_and_spreads_high_bits() {
        let mut m: IntMap<u64, u64> = IntMap::default();
        for i in 0..1000 {
            m.insert(i, i * 2);
        }
        assert_eq!(m.get(&500), Some(&1000));
        let top = |k: u64| {
            let mut h = IntHasher::default();
            h.write_u64(k);
            h.finish() >> 57
        };
        let distinct: std::collections::HashSet<u64> = (0..64).map(top).collect();
        assert!(distinct.len() > 32);
    }
}
