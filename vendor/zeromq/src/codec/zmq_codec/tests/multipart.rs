use super::*;

#[test]
fn many_empty_frames_decode_on_a_bounded_stack() {
    const CHILD_ENV: &str = "ZEROMQ_MULTIPART_STACK_TEST_CHILD";
    if std::env::var_os(CHILD_ENV).is_none() {
        // Stack overflow aborts the process, so keep it isolated from the test runner.
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "codec::zmq_codec::tests::multipart::many_empty_frames_decode_on_a_bounded_stack",
                "--nocapture",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "decoder subprocess failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(String::from_utf8_lossy(&output.stderr).contains("multipart stack test completed"));
        return;
    }

    std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(|| {
            let mut codec = ZmqCodec::new();
            codec.state = DecoderState::FrameHeader;
            codec.waiting_for = 1;
            let mut input = BytesMut::from([1, 0].repeat(4_000).as_slice());
            input.extend_from_slice(&[0, 0]);

            let Message::Message(message) = codec.decode(&mut input).unwrap().unwrap() else {
                panic!("expected multipart message");
            };

            assert_eq!(message.len(), 4_001);
            assert!(message.iter().all(Bytes::is_empty));
            assert!(input.is_empty());
        })
        .unwrap()
        .join()
        .unwrap();
    eprintln!("multipart stack test completed");
}

#[test]
fn fragmented_multipart_preserves_empty_frames_and_following_message() {
    let mut codec = ZmqCodec::new();
    codec.state = DecoderState::FrameHeader;
    codec.waiting_for = 1;
    let mut wire = [1, 0].repeat(4_000);
    wire.extend_from_slice(&[0, 1, b'x', 0, 1, b'y']);
    let mut input = BytesMut::new();
    let mut messages = Vec::new();

    // Odd chunks split frame headers as well as multipart boundaries.
    for chunk in wire.chunks(127) {
        input.extend_from_slice(chunk);
        while let Some(message) = codec.decode(&mut input).unwrap() {
            let Message::Message(message) = message else {
                panic!("expected multipart message");
            };
            messages.push(message);
        }
    }

    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].len(), 4_001);
    assert!(messages[0].iter().take(4_000).all(Bytes::is_empty));
    assert_eq!(messages[0].get(4_000), Some(&Bytes::from_static(b"x")));
    assert_eq!(messages[1].get(0), Some(&Bytes::from_static(b"y")));
    assert_eq!(messages[1].len(), 1);
    assert!(input.is_empty());
}

/// NITSUM PATCH: the frame cap and the per-frame overhead (the memory blow-up of issue 29).
fn header_state() -> ZmqCodec {
    let mut codec = ZmqCodec::new();
    codec.state = DecoderState::FrameHeader;
    codec.waiting_for = 1;
    codec
}

#[test]
fn a_message_at_the_frame_cap_decodes_and_the_next_one_starts_afresh() {
    let mut codec = header_state();
    for _ in 0..2 {
        let mut input = BytesMut::from([1, 0].repeat(MAX_MESSAGE_FRAMES - 1).as_slice());
        input.extend_from_slice(&[0, 1, b'z']);
        let Message::Message(message) = codec.decode(&mut input).unwrap().unwrap() else {
            panic!("expected multipart message");
        };
        assert_eq!(message.len(), MAX_MESSAGE_FRAMES);
        assert_eq!(message.get(MAX_MESSAGE_FRAMES - 1), Some(&Bytes::from_static(b"z")));
        assert!(input.is_empty());
    }
}

#[test]
fn an_endless_message_of_empty_frames_is_a_decode_error() {
    let mut codec = header_state();
    // `\x01\x00` forever, fed in reads of 8 KiB: an error once the cap is passed.
    let chunk = [1u8, 0].repeat(4096);
    let mut input = BytesMut::new();
    let mut fed = 0usize;
    let err = loop {
        input.extend_from_slice(&chunk);
        fed += chunk.len();
        assert!(fed <= 4 * MAX_MESSAGE_FRAMES, "no error after {fed} bytes");
        match codec.decode(&mut input) {
            Ok(None) => continue,
            Ok(Some(_)) => panic!("an unterminated message decoded"),
            Err(e) => break e,
        }
    };
    assert!(format!("{err:?}").contains("MAX_MESSAGE_FRAMES"), "{err:?}");
    assert_eq!(codec.buffered_frames, MAX_MESSAGE_FRAMES);
}

#[test]
fn frame_overhead_counts_toward_the_message_byte_cap() {
    let mut codec = header_state();
    // A first frame leaving less room than one empty frame's overhead: the next empty frame
    // is refused even though it carries no payload.
    let first = MAX_MESSAGE_BYTES - 2 * FRAME_OVERHEAD_BYTES + 1;
    let mut input = BytesMut::from(&[3u8][..]);
    input.extend_from_slice(&(first as u64).to_be_bytes());
    input.extend_from_slice(&vec![7u8; first]);
    input.extend_from_slice(&[1, 0]);
    let err = codec.decode(&mut input).unwrap_err();
    assert!(format!("{err:?}").contains("MAX_MESSAGE_BYTES"), "{err:?}");
}
