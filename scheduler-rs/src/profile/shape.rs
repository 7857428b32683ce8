//! A group's parallel shape (TP level or pipeline) and its key in the profile file.

use serde::{Deserialize, Serialize};

/// A group's parallel shape: `pp` pipeline stages of `tp` devices each (`pp` 1: a TP group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape {
    pub tp: u32,
    pub pp: u32,
}

impl Shape {
    /// Devices a group of this shape takes.
    pub fn devices(self) -> u32 {
        self.tp * self.pp
    }

    /// The profile's key: `"2"` for TP 2, `"2x2"` for two stages of TP 2.
    pub fn key(self) -> String {
        if self.pp == 1 {
            self.tp.to_string()
        } else {
            format!("{}x{}", self.tp, self.pp)
        }
    }

    /// Parse a `pipelines` key, `"TPxPP"`.
    pub(super) fn parse(key: &str) -> Option<Self> {
        let (tp, pp) = key.split_once('x')?;
        let shape = Shape {
            tp: tp.parse().ok()?,
            pp: pp.parse().ok()?,
        };
        (shape.tp >= 1 && shape.pp >= 2).then_some(shape)
    }
}

impl From<u32> for Shape {
    fn from(tp: u32) -> Self {
        Shape { tp, pp: 1 }
    }
}
