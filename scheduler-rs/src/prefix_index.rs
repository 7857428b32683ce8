//! Cache-aware routing (SGLang's cache-aware router, FastSwitch's KV reuse across turns):
//! remember which group last prefilled each prompt prefix, so a request that starts the same
//! way (a conversation's next turn, a shared system prompt) can go where its prefix's KV is
//! probably still cached (the worker's prefix cache, python/nitsum/kv/prefix_cache.py).
//!
//! A prompt is cut into blocks of `BLOCK` tokens; block i's key hashes blocks 0..=i, so a key
//! names a whole prefix. The index maps keys to the group leader that last got such a
//! prompt. It is a hint only (the worker may have evicted the pages; a hash may collide): the
//! dispatcher takes it when that group is a candidate anyway and not much busier.

use std::collections::VecDeque;
use std::hash::Hasher;

use crate::fasthash::{IntHasher, IntMap};

/// Tokens per block: a multiple of the worker's page sizes (16 tokens a page at TP 1).
pub const BLOCK: usize = 64;

/// Keys of every full block prefix of `ids`, shortest first.
pub fn prefix_keys(ids: &[u32]) -> Vec<u64> {
    salted_keys(ids, IntHasher::default())
}

/// A prompt's keys under a cache salt (vLLM's `cache_salt`): its prefix keys (different salts
/// never share a key, as their KV is never shared on the worker), led by the key of its
/// `prompt_cache_key` when it has one (the shortest "prefix": a request with the same key but
/// another prompt finds it).
pub fn cache_keys(ids: &[u32], salt: Option<&str>, key: Option<&str>) -> Vec<u64> {
    let seeded = |tag: u8, text: Option<&str>| {
        let mut h = IntHasher::default();
        if let Some(text) = text {
            h.write_u8(tag);
            h.write(text.as_bytes());
            h.write_u8(0xff);
        }
        h
    };
    let mut keys = Vec::with_capacity(ids.len() / BLOCK + 1);
    if let Some(key) = key {
        let mut h = seeded(1, salt);
        h.write_u8(2);
        h.write(key.as_bytes());
        keys.push(h.finish());
    }
    keys.extend(salted_keys(ids, seeded(1, salt)));
    keys
}

fn salted_keys(ids: &[u32], mut h: IntHasher) -> Vec<u64> {
    ids.chunks_exact(BLOCK)
        .map(move |block| {
            for &t in block {
                h.write_u32(t);
            }
            h.finish()
        })
        .collect()
}

/// Prefix key → group leader, bounded (oldest entries go first).
#[derive(Debug)]
pub struct PrefixIndex {
    leaders: IntMap<u64, u32>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        PrefixIndex::with_capacity(1 << 18)
    }
}

impl PrefixIndex {
    pub fn with_capacity(capacity: usize) -> Self {
        PrefixIndex {
            leaders: IntMap::default(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// The leader that got the longest known prefix among `keys`, and its length in blocks.
    pub fn lookup(&self, keys: &[u64]) -> Option<(u32, usize)> {
        keys.iter()
            .enumerate()
            .rev()
            .find_map(|(i, k)| self.leaders.get(k).map(|&l| (l, i + 1)))
    }

    /// Remember that `leader` got a prompt with these prefix keys.
    pub fn record(&mut self, keys: &[u64], leader: u32) {
        for &k in keys {
            if self.leaders.insert(k, leader).is_none() {
                self.order.push_back(k);
            }
        }
        while self.order.len() > self.capacity {
            if let Some(k) = self.order.pop_front() {
                self.leaders.remove(&k);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.leaders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leaders.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_whole_prefixes_and_the_longest_known_one_wins() {
        let a: Vec<u32> = (0..200).collect();
        let mut b = a[..130].to_vec();
        b.extend(1000..1100);
        let (ka, kb) = (prefix_keys(&a), prefix_keys(&b));
        assert_eq!((ka.len(), kb.len()), (3, 3));
        assert_eq!(ka[..2], kb[..2]); // the first 128 tokens are shared
        assert_ne!(ka[2], kb[2]);
        let mut idx = PrefixIndex::default();
        assert_eq!(idx.lookup(&ka), None);
        idx.record(&ka, 4);
        assert_eq!(idx.lookup(&kb), Some((4, 2)));
        idx.record(&kb, 7);
        assert_eq!(idx.lookup(&kb), Some((7, 3)));
        assert_eq!(idx.lookup(&ka), Some((4, 3)));
        assert_eq!(idx.lookup(&prefix_keys(&a[..63])), None); // no full block
    }

    #[test]
    fn salts_and_cache_keys_change_the_keys() {
        let ids: Vec<u32> = (0..130).collect();
        let plain = cache_keys(&ids, None, None);
        assert_eq!(plain, prefix_keys(&ids));
        let salted = cache_keys(&ids, Some("a"), None);
        assert_eq!(salted.len(), 2);
        assert!(salted.iter().all(|k| !plain.contains(k)));
        assert_ne!(salted, cache_keys(&ids, Some("b"), None));
        // A cache key leads: the same key on another prompt shares that one key only.
        let keyed = cache_keys(&ids, None, Some("k"));
        let other = cache_keys(&[7; 64], None, Some("k"));
        assert_eq!((keyed.len(), keyed[0]), (3, other[0]));
        assert_eq!(keyed[1..], plain[..]);
    }

    #[test]
    fn the_index_is_bounded() {
        let mut idx = PrefixIndex::with_capacity(4);
        for i in 0..10u32 {
            let ids: Vec<u32> = (0..64).map(|t| t + 1000 * i).collect();
            idx.record(&prefix_keys(&ids), i);
        }
        assert_eq!(idx.len(), 4);
        let last: Vec<u32> = (0..64).map(|t| t + 9000).collect();
        assert_eq!(idx.lookup(&prefix_keys(&last)), Some((9, 1)));
    }
}
