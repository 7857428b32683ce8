//! Tests of worker liveness and the pool shape the planner sees.

use super::*;

fn with_domains(domains: &[Option<u32>], levels: &[u32]) -> Registry {
    let mut r = Registry::default();
    for (id, &domain) in domains.iter().enumerate() {
        let info = WorkerInfo {
            tp_levels: levels.to_vec(),
            domain,
            ..WorkerInfo::default()
        };
        r.register(WorkerId(id as u32), Bytes::new(), info, Instant::now());
    }
    r
}

#[test]
fn pool_shape_keeps_tp_groups_and_kv_handoffs_inside_domains() {
    // One host worker with 4 devices: every level, P/D possible.
    let one = with_domains(&[Some(0); 4], &[1, 2, 4]);
    let shape = one.pool_shape();
    assert_eq!(
        (shape.devices, shape.tp_levels.clone(), shape.kv_linked),
        (4, vec![1, 2, 4], true)
    );
    // Two host workers of 2 devices: TP 4 would span both; no P/D across them.
    let two = with_domains(&[Some(0), Some(0), Some(2), Some(2)], &[1, 2, 4]);
    assert_eq!(two.pool_shape().tp_levels, [1, 2]);
    assert!(!two.pool_shape().kv_linked);
    // Domains of 3 and 1 devices: TP 2 would straddle ids 2-3.
    let odd = with_domains(&[Some(0), Some(0), Some(0), Some(3)], &[1, 2]);
    assert_eq!(odd.pool_shape().tp_levels, [1]);
    // Workers that name no domain (mock workers) share one.
    assert_eq!(
        with_domains(&[None; 4], &[1, 2, 4]).pool_shape().tp_levels,
        [1, 2, 4]
    );
    // Separate single-device workers (`nitsum serve` without --tp-switching).
    let solo = with_domains(&[Some(0), Some(1)], &[1]).pool_shape();
    assert_eq!((solo.tp_levels, solo.kv_linked), (vec![1], false));
}

#[test]
fn one_kv_transport_links_domains_for_pd_but_tp_stays_inside_each() {
    let mut r = with_domains(&[Some(0), Some(0), Some(2), Some(2)], &[1, 2, 4]);
    let join = |r: &mut Registry, id: u32, transport: Option<&str>| {
        let mut info = r.get(WorkerId(id)).expect("registered").info.clone();
        info.kv_transport = transport.map(str::to_owned);
        r.register(WorkerId(id), Bytes::new(), info, Instant::now());
    };
    for id in 0..4 {
        join(&mut r, id, Some("tcp://10.0.0.1:29600"));
    }
    let shape = r.pool_shape();
    // P/D may span the two processes; a TP-4 group still may not.
    assert_eq!((shape.tp_levels, shape.kv_linked), (vec![1, 2], true));
    // One worker on another transport (or none) unlinks them.
    join(&mut r, 3, Some("tcp://10.0.0.9:29600"));
    assert!(!r.pool_shape().kv_linked);
    join(&mut r, 3, None);
    assert!(!r.pool_shape().kv_linked);
}

#[test]
fn silent_workers_are_reaped() {
    let mut r = Registry::default();
    let t0 = Instant::now();
    let (w0, w1) = (WorkerId(0), WorkerId(1));
    assert!(!r.register(w0, Bytes::from_static(b"0"), WorkerInfo::default(), t0));
    r.register(w1, Bytes::from_static(b"1"), WorkerInfo::default(), t0);
    let later = t0 + Duration::from_millis(2000);
    assert!(r.touch(w1, later));
    assert!(!r.touch(WorkerId(7), later));
    assert_eq!(
        r.reap(t0 + Duration::from_millis(3500), Duration::from_secs(3)),
        [w0]
    );
    assert_eq!(r.ids().collect::<Vec<_>>(), [w1]);
    assert!(r.register(w1, Bytes::from_static(b"1"), WorkerInfo::default(), later));
}
