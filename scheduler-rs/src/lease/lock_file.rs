//! The lease on one host: an exclusive `flock` on a shared lock file (std's `File::try_lock`),
//! and the leader's record beside it (`PATH.leader`, JSON, replaced atomically).
//!
//! NOTE (invariants): the kernel drops the lock when its holder exits, `kill -9` included, so a
//! dead leader frees the lease at once. Only the lock holder writes the record; it raises the
//! term it finds there by one, so terms only grow while the record file lives. The lock file
//! itself is never replaced (a lock is on an inode): a holder that finds another inode at the
//! path (someone deleted it) no longer leads.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{Candidate, LeaderInfo};

/// An flock lease on `path`.
#[derive(Debug)]
pub struct FileLease {
    path: PathBuf,
    record: PathBuf,
    /// The open, locked file while this router holds the lease.
    held: Option<File>,
}

impl FileLease {
    /// A lease on the lock file `path` (created on first use; its directory must exist).
    pub fn new(path: &Path) -> Self {
        let mut record = path.as_os_str().to_owned();
        record.push(".leader");
        FileLease {
            path: path.to_path_buf(),
            record: PathBuf::from(record),
            held: None,
        }
    }

    fn open(&self) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .with_context(|| format!("opening the lease file {}", self.path.display()))
    }

    /// Take the lock if nobody holds it; then publish `me` under the next term.
    pub fn try_acquire(&mut self, me: &Candidate) -> Result<Option<u64>> {
        if self.held.is_some() {
            return Ok(self.read()?.map(|l| l.term));
        }
        let file = self.open()?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", self.path.display()))
            }
        }
        let term = self.read()?.map_or(0, |l| l.term) + 1;
        self.write(&me.info(term))?;
        self.held = Some(file);
        Ok(Some(term))
    }

    /// Whether nobody holds the lock now (a shared-lock probe, released at once).
    pub fn is_free(&self) -> Result<bool> {
        if self.held.is_some() {
            return Ok(false);
        }
        let file = self.open()?;
        match file.try_lock_shared() {
            Ok(()) => {
                file.unlock().ok();
                Ok(true)
            }
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("probing {}", self.path.display()))
            }
        }
    }

    /// As the holder: whether the lease is still ours (the lock file was not replaced).
    pub fn keep(&mut self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(file) = &self.held else {
            return false;
        };
        let ours = file.metadata().map(|m| (m.dev(), m.ino())).ok();
        let at_path = std::fs::metadata(&self.path)
            .map(|m| (m.dev(), m.ino()))
            .ok();
        if ours.is_some() && ours == at_path {
            return true;
        }
        self.held = None;
        false
    }

    /// The published leader while somebody holds the lock (a stale record is not a leader).
    pub fn leader(&self) -> Result<Option<LeaderInfo>> {
        if self.held.is_none() && self.is_free()? {
            return Ok(None);
        }
        self.read()
    }

    /// Give the lease up (the lock goes with the file).
    pub fn release(&mut self) {
        self.held = None;
    }

    fn read(&self) -> Result<Option<LeaderInfo>> {
        match std::fs::read(&self.record) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.record.display())),
        }
    }

    /// Replace the record atomically (a temporary file renamed over it), synced to disk.
    fn write(&self, info: &LeaderInfo) -> Result<()> {
        let mut tmp = self.record.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(&serde_json::to_vec(info)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.record)
            .with_context(|| format!("replacing {}", self.record.display()))
    }
}
