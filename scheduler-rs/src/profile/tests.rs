//! Tests of profile loading, validation and interpolation.

use super::*;

pub(crate) const SAMPLE: &str = r#"{
  "schema": "nitsum-profile/1", "device": "test", "model": "m", "tp_levels": [1, 2],
  "prefill": {"1": [{"tokens": 100, "ms": 10}, {"tokens": 300, "ms": 30}],
              "2": [{"tokens": 100, "ms": 6}]},
  "decode": {"1": [{"batch": 1, "context": 100, "ms": 5}, {"batch": 11, "context": 100, "ms": 15},
                   {"batch": 1, "context": 300, "ms": 7}, {"batch": 11, "context": 300, "ms": 27}],
             "2": [{"batch": 1, "context": 100, "ms": 3}]}
}"#;

#[test]
fn prefill_interpolates_holds_and_extrapolates() {
    let p = Profile::from_json(SAMPLE).unwrap();
    assert_eq!(p.tp_levels(), vec![1, 2]);
    assert_eq!(p.prefill_ms(1, 200.0), 20.0);
    assert_eq!(p.prefill_ms(1, 50.0), 10.0);
    assert_eq!(p.prefill_ms(1, 500.0), 50.0);
    assert_eq!(p.prefill_ms(2, 1000.0), 6.0);
    // (100, 10) and (300, 30) extrapolate to 0 ms at 0 tokens; one point: its value.
    assert_eq!(p.prefill_fixed_ms(1), 0.0);
    assert_eq!(p.prefill_extra_ms(1, 200.0), 20.0);
    assert_eq!(p.prefill_fixed_ms(2), 6.0);
    assert_eq!(p.prefill_extra_ms(2, 50.0), 0.0);
}

#[test]
fn sp_points_make_each_point_the_faster_mode() {
    let mut file: ProfileFile = serde_json::from_str(SAMPLE).unwrap();
    // SP at TP 2: slower at 100 prompt tokens, faster at 400; decode faster at batch 1.
    file.sp_prefill.insert(
        "2".into(),
        vec![
            PrefillPoint {
                tokens: 100.0,
                ms: 8.0,
            },
            PrefillPoint {
                tokens: 400.0,
                ms: 12.0,
            },
        ],
    );
    file.sp_decode.insert(
        "2".into(),
        vec![DecodePoint {
            batch: 1.0,
            context: 100.0,
            ms: 2.0,
        }],
    );
    let p = Profile::from_file(file.clone()).unwrap();
    assert_eq!(p.prefill_ms(2, 100.0), 6.0); // TP wins
    assert_eq!(p.prefill_ms(2, 400.0), 6.0); // TP's single point holds at 6 < 12
    assert_eq!(p.decode_ms(2, 1.0, 100.0), 2.0); // SP wins
    assert_eq!(p.prefill_ms(1, 300.0), 30.0); // other levels untouched
                                              // A round trip through the file keeps the SP points (the lookahead rebuilds from it).
    let again: ProfileFile =
        serde_json::from_str(&serde_json::to_string(p.file()).unwrap()).unwrap();
    assert_eq!(again.sp_decode["2"].len(), 1);
    // With the runtime's threshold, each point is the mode it runs in: SP above 50
    // tokens, so 100 prompt tokens run (and are planned) as SP even though TP is faster.
    let mut shifted = file.clone();
    shifted.shift_threshold.insert("2".into(), Some(50.0));
    let p = Profile::from_file(shifted.clone()).unwrap();
    assert_eq!(p.prefill_ms(2, 100.0), 8.0);
    assert_eq!(p.decode_ms(2, 1.0, 100.0), 3.0); // 1 token: TP
    shifted.shift_threshold.insert("2".into(), None); // TP only
    let p = Profile::from_file(shifted).unwrap();
    assert_eq!(p.decode_ms(2, 1.0, 100.0), 3.0);
    assert_eq!(p.prefill_ms(2, 100.0), 6.0);
    // SP at TP 1, or at a level the profile lacks, is refused.
    let mut bad = file;
    bad.sp_prefill.insert(
        "1".into(),
        vec![PrefillPoint {
            tokens: 1.0,
            ms: 1.0,
        }],
    );
    let e = format!("{:#}", Profile::from_file(bad).unwrap_err());
    assert!(e.contains("SP points for level 1"), "{e}");
}

#[test]
fn pipelines_are_shapes_of_their_own() {
    let mut file: ProfileFile = serde_json::from_str(SAMPLE).unwrap();
    file.pipelines = vec!["1x2".into()];
    file.pp_prefill.insert(
        "1x2".into(),
        vec![PrefillPoint {
            tokens: 100.0,
            ms: 4.0,
        }],
    );
    file.pp_decode.insert(
        "1x2".into(),
        vec![DecodePoint {
            batch: 1.0,
            context: 100.0,
            ms: 2.5,
        }],
    );
    let p = Profile::from_file(file.clone()).unwrap();
    let pipe = Shape { tp: 1, pp: 2 };
    assert_eq!(p.prefill_ms(pipe, 100.0), 4.0);
    assert_eq!(p.decode_ms(pipe, 1.0, 100.0), 2.5);
    assert_eq!(p.decode_ms(2, 1.0, 100.0), 3.0); // TP 2, same devices: its own curve
    assert_eq!(p.tp_levels(), vec![1, 2]);
    assert_eq!(p.shapes(), vec![Shape::from(1), Shape::from(2), pipe]);
    assert_eq!((pipe.devices(), pipe.key()), (2, "1x2".to_string()));
    let mut bad = file.clone();
    bad.pipelines = vec!["2".into()];
    let e = format!("{:#}", Profile::from_file(bad).unwrap_err());
    assert!(e.contains("is not \"TPxPP\""), "{e}");
    let mut missing = file;
    missing.pp_decode.clear();
    let e = format!("{:#}", Profile::from_file(missing).unwrap_err());
    assert!(e.contains("no decode points for pipeline 1x2"), "{e}");
}

#[test]
fn decode_is_bilinear() {
    let p = Profile::from_json(SAMPLE).unwrap();
    assert_eq!(p.decode_ms(1, 6.0, 100.0), 10.0);
    assert_eq!(p.decode_ms(1, 6.0, 300.0), 17.0);
    assert_eq!(p.decode_ms(1, 6.0, 200.0), 13.5);
    // Past the last context row: extrapolate from the last two rows (10 → 17 per 200).
    assert_eq!(p.decode_ms(1, 6.0, 500.0), 24.0);
    assert_eq!(p.decode_ms(1, 21.0, 100.0), 25.0);
    assert_eq!(p.max_batch(1), 11.0);
}

#[test]
fn validation_errors_are_clear() {
    let bad_schema = SAMPLE.replace("nitsum-profile/1", "v0");
    let e = format!("{:#}", Profile::from_json(&bad_schema).unwrap_err());
    assert!(e.contains("schema"), "{e}");
    let missing = SAMPLE.replace("\"tp_levels\": [1, 2]", "\"tp_levels\": [1, 4]");
    let e = format!("{:#}", Profile::from_json(&missing).unwrap_err());
    assert!(e.contains("no prefill points for tp 4"), "{e}");
    let negative = SAMPLE.replace("\"ms\": 6}", "\"ms\": -6}");
    let e = format!("{:#}", Profile::from_json(&negative).unwrap_err());
    assert!(e.contains("prefill tp 2") && e.contains("positive"), "{e}");
    let dup = SAMPLE.replace("\"tokens\": 300", "\"tokens\": 100");
    assert!(format!("{:#}", Profile::from_json(&dup).unwrap_err()).contains("duplicate"));
}
