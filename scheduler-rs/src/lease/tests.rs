use std::time::{Duration, Instant};

use super::*;
use crate::testutil::Etcd;

fn candidate(index: u32) -> Candidate {
    Candidate {
        index,
        addr: format!("tcp://127.0.0.1:{}", 6000 + index),
    }
}

#[test]
fn lease_specs_parse_and_bad_ones_are_refused() {
    assert_eq!(
        LeaseSpec::parse("file:/run/nitsum/lease").unwrap(),
        LeaseSpec::File("/run/nitsum/lease".into())
    );
    assert_eq!(
        LeaseSpec::parse("etcd:http://10.0.0.1:2379").unwrap(),
        LeaseSpec::Etcd {
            endpoint: "http://10.0.0.1:2379".into(),
            key: DEFAULT_ETCD_KEY.into()
        }
    );
    assert_eq!(
        LeaseSpec::parse("etcd:http://h:2379/pools/a").unwrap(),
        LeaseSpec::Etcd {
            endpoint: "http://h:2379".into(),
            key: "/pools/a".into()
        }
    );
    for bad in [
        "file:",
        "etcd:https://h:2379",
        "etcd:http://",
        "zk:h:2181",
        "/tmp/x",
    ] {
        assert!(LeaseSpec::parse(bad).is_err(), "{bad}");
    }
}

/// Two routers' handles on `spec`: the first takes the (free) lease, the second cannot and
/// sees the first lead. Returns both and the first's term.
async fn first_takes_it(spec: &LeaseSpec) -> (Lease, Lease, u64) {
    let (mut a, mut b) = (Lease::open(spec, 1), Lease::open(spec, 1));
    assert_eq!(a.leader().await.unwrap(), None);
    let t1 = a.try_acquire(&candidate(0)).await.unwrap().expect("free");
    assert_eq!(
        b.try_acquire(&candidate(1)).await.unwrap(),
        None,
        "held by a"
    );
    assert_eq!(b.leader().await.unwrap(), Some(candidate(0).info(t1)));
    assert!(a.keep().await);
    (a, b, t1)
}

#[tokio::test]
async fn a_file_lease_has_one_holder_and_each_holder_a_larger_term() {
    let dir = std::env::temp_dir().join(format!("nitsum-lease-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = LeaseSpec::File(dir.join("lease"));
    let (mut a, mut b, t1) = first_takes_it(&spec).await;
    // The holder goes (as its process would on kill -9: the lock goes with the file).
    a.release().await;
    assert!(!a.keep().await);
    assert_eq!(
        b.leader().await.unwrap(),
        None,
        "a stale record is no leader"
    );
    let t2 = b
        .try_acquire(&candidate(1))
        .await
        .unwrap()
        .expect("free again");
    assert!(t2 > t1, "{t2} > {t1}");
    assert_eq!(a.leader().await.unwrap(), Some(candidate(1).info(t2)));
    // Someone deletes the lock file: the holder no longer counts itself the leader.
    std::fs::remove_file(dir.join("lease")).unwrap();
    assert!(!b.keep().await);
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn an_etcd_lease_has_one_holder_and_expires_without_renewal() {
    let Some(etcd) = Etcd::start() else {
        eprintln!("skipped: etcd is not installed (Debian: apt-get install etcd-server)");
        return;
    };
    let spec = LeaseSpec::parse(&format!("etcd:{}/test/lease", etcd.url)).unwrap();
    let (mut a, mut b, t1) = first_takes_it(&spec).await;
    // a stops renewing (a paused or dead leader): the key goes within the TTL (1 s, and
    // etcd's expiry check runs every 500 ms).
    let t0 = Instant::now();
    let t2 = loop {
        if let Some(t) = b.try_acquire(&candidate(1)).await.unwrap() {
            break t;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(t2 > t1, "{t2} > {t1}");
    assert!(
        !a.keep().await,
        "a deposed holder learns it on its next renewal"
    );
    assert_eq!(a.leader().await.unwrap(), Some(candidate(1).info(t2)));
    b.release().await;
    assert_eq!(a.leader().await.unwrap(), None, "released at once");
}
