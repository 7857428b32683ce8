//! A throw-away single-member etcd server (Debian's `etcd-server`) for the lease tests: free
//! loopback ports, a data directory removed on drop, fast elections so that a 1 s lease TTL
//! is allowed (etcd's minimum TTL is 1.5 election timeouts).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::TempDir;

/// A running etcd; killed (and its data removed) on drop.
#[derive(Debug)]
pub struct Etcd {
    /// Its client URL, `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    _dir: TempDir,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("bound").port()
}

/// Whether `GET /health` on `port` says the member serves.
fn healthy(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    let mut answer = String::new();
    s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.contains("\"health\":\"true\"")
}

impl Etcd {
    /// Start one from `$NITSUM_ETCD` or `etcd` on the PATH; `None` when there is none.
    /// Panics when it is there but does not come up within 20 s.
    pub fn start() -> Option<Etcd> {
        let bin = std::env::var("NITSUM_ETCD").unwrap_or_else(|_| "etcd".into());
        Command::new(&bin)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .ok()?;
        let dir = TempDir::new("etcd");
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&bin)
            .args(["--name", "nitsum-test", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("nitsum-test={peer_url}")])
            .args(["--heartbeat-interval", "25", "--election-timeout", "250"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd runs");
        let etcd = Etcd {
            url: client_url,
            child,
            _dir: dir,
        };
        let t0 = Instant::now();
        while !healthy(client) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "etcd did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(etcd)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
