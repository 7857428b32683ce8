use super::peer::Frame;
use super::peer::*;
use crate::plan::{NamedGroupPlan, Role};
use crate::worker_auth::WorkerSecret;

fn secret(s: &str) -> WorkerSecret {
    WorkerSecret::new(s).unwrap()
}

fn plan() -> PeerPlan {
    PeerPlan {
        term: 7,
        sent_ms: 1_700_000_000_123,
        epoch: (7 << 32) | 3,
        routers: 2,
        groups: vec![NamedGroupPlan {
            members: vec![0, 1],
            tp: 2,
            pp: 1,
            role: Role::Mixed,
            tiers: vec!["strict".into()],
            accepts_background: true,
            max_rps: 12.5,
            max_inflight: f64::INFINITY,
        }],
        max_batch: vec![Some(32)],
    }
}

fn stats() -> PeerStats {
    PeerStats {
        term: 7,
        sent_ms: 1_700_000_000_456,
        full: true,
        arrivals: vec![("strict".into(), 0.25, 100)],
        completions: vec![("relaxed".into(), 0.5, 17)],
        outcomes: vec![(0.75, "strict".into(), true)],
        inflight: vec![("strict".into(), 3.0, 0.1, true)],
    }
}

#[test]
fn peer_messages_round_trip_with_their_sender() {
    let key = secret("0123456789abcdef0123");
    for msg in [PeerMessage::Plan(plan()), PeerMessage::Stats(stats())] {
        let bytes = encode_peer(&msg, 3, Some(&key));
        assert_eq!(decode_peer(&bytes, Some(&key)), Ok((3, msg.clone())));
        // An insecure plane sends no MAC and checks none.
        let bare = encode_peer(&msg, 1, None);
        assert_eq!(decode_peer(&bare, None), Ok((1, msg)));
    }
}

#[test]
fn a_wrong_secret_a_missing_mac_or_a_changed_byte_is_refused() {
    let key = secret("0123456789abcdef0123");
    let msg = PeerMessage::Plan(plan());
    let bytes = encode_peer(&msg, 0, Some(&key));
    let other = secret("another secret of 16+ bytes");
    assert_eq!(decode_peer(&bytes, Some(&other)), Err(PeerError::BadMac));
    assert_eq!(
        decode_peer(&encode_peer(&msg, 0, None), Some(&key)),
        Err(PeerError::BadMac)
    );
    // The same MAC does not pass for another sender index.
    let mut frame: Frame = rmp_serde::from_slice(&bytes).unwrap();
    frame.router = 1;
    let forged = rmp_serde::to_vec_named(&frame).unwrap();
    assert_eq!(decode_peer(&forged, Some(&key)), Err(PeerError::BadMac));
    frame.router = 0;
    let same = rmp_serde::to_vec_named(&frame).unwrap();
    assert_eq!(decode_peer(&same, Some(&key)), Ok((0, msg.clone())));
    // Any changed byte of the body.
    let mut flipped = bytes.clone();
    let at = flipped.len() - 80;
    flipped[at] ^= 1;
    assert!(decode_peer(&flipped, Some(&key)).is_err());
    assert!(matches!(
        decode_peer(b"\x81\xa1v\x01", Some(&key)),
        Err(PeerError::Malformed(_))
    ));
}
