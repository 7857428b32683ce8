use std::collections::HashMap;

use serde_json::json;

use super::*;
use crate::protocols::native::NativeGenerateRequest;
use crate::protocols::openai::CompletionRequest;

fn check(f: SamplingFields) -> Result<Sampling, String> {
    f.sampling(&GenerationDefaults::default(), Some(100))
        .map_err(|e| e.param.unwrap_or_default())
}

#[test]
fn fields_reach_the_sampling_and_bad_values_name_their_field() {
    let ok = check(SamplingFields {
        temperature: Some(0.5),
        top_p: Some(0.9),
        top_k: Some(0),
        seed: Some(7),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(-1.0),
        repetition_penalty: Some(1.2),
        logit_bias: Some(HashMap::from([("7".into(), 100.0), ("3".into(), -5.5)])),
        min_p: Some(0.1),
        no_repeat_ngram_size: Some(3),
    })
    .unwrap();
    assert_eq!(
        (ok.temperature, ok.top_p, ok.top_k, ok.seed),
        (0.5, 0.9, -1, Some(7))
    );
    assert_eq!(
        (
            ok.presence_penalty,
            ok.frequency_penalty,
            ok.repetition_penalty,
            ok.min_p
        ),
        (0.5, -1.0, 1.2, 0.1)
    );
    assert_eq!(ok.logit_bias, vec![(3, -5.5), (7, 100.0)]);
    assert_eq!(ok.no_repeat_ngram_size, 3);
    assert_eq!(
        check(SamplingFields::default()).unwrap(),
        Sampling::default()
    );
    let field = |f: SamplingFields| check(f).unwrap_err();
    let f = SamplingFields::default;
    let bad = [
        (
            SamplingFields {
                temperature: Some(-0.1),
                ..f()
            },
            "temperature",
        ),
        (
            SamplingFields {
                top_p: Some(0.0),
                ..f()
            },
            "top_p",
        ),
        (
            SamplingFields {
                top_k: Some(-2),
                ..f()
            },
            "top_k",
        ),
        (
            SamplingFields {
                presence_penalty: Some(2.5),
                ..f()
            },
            "presence_penalty",
        ),
        (
            SamplingFields {
                frequency_penalty: Some(f64::NAN),
                ..f()
            },
            "frequency_penalty",
        ),
        (
            SamplingFields {
                repetition_penalty: Some(0.0),
                ..f()
            },
            "repetition_penalty",
        ),
        (
            SamplingFields {
                min_p: Some(1.5),
                ..f()
            },
            "min_p",
        ),
    ];
    for (fields, name) in bad {
        assert_eq!(field(fields), name);
    }
    let bias = |k: &str, v| SamplingFields {
        logit_bias: Some(HashMap::from([(k.into(), v)])),
        ..f()
    };
    assert_eq!(field(bias("x", 1.0)), "logit_bias");
    assert_eq!(field(bias("100", 1.0)), "logit_bias");
    assert_eq!(field(bias("5", 100.5)), "logit_bias");
}

#[test]
fn the_model_defaults_fill_only_unset_fields() {
    let defaults = GenerationDefaults {
        temperature: Some(0.7),
        top_p: Some(0.8),
        top_k: Some(20),
    };
    let own = SamplingFields {
        temperature: Some(0.0),
        ..SamplingFields::default()
    };
    let s = own.sampling(&defaults, None).unwrap();
    assert_eq!((s.temperature, s.top_p, s.top_k), (0.0, 0.8, 20));
}

#[test]
fn both_apis_take_every_knob_under_the_same_name() {
    let knobs = json!({
        "temperature": 0.5, "top_p": 0.9, "top_k": 4, "seed": 3, "presence_penalty": 0.1,
        "frequency_penalty": 0.2, "repetition_penalty": 1.1, "min_p": 0.05,
        "logit_bias": {"5": -1.0}, "no_repeat_ngram_size": 2,
    });
    let mut openai = knobs.clone();
    openai["prompt"] = json!("hi");
    openai["max_tokens"] = json!(3);
    openai["min_tokens"] = json!(1);
    let openai: CompletionRequest = serde_json::from_value(openai).unwrap();
    let mut native = knobs.clone();
    native["max_new_tokens"] = json!(3);
    native["min_new_tokens"] = json!(1);
    let native: NativeGenerateRequest =
        serde_json::from_value(json!({"text": "hi", "sampling_params": native})).unwrap();
    let (a, b): (&dyn GenerateBody, &dyn GenerateBody) = (&openai.common, &native.sampling_params);
    assert_eq!(a.sampling_fields(), b.sampling_fields());
    assert_eq!(a.sampling_fields().no_repeat_ngram_size, Some(2));
    assert!(openai.common.extra.is_empty() && native.sampling_params.extra.is_empty());
    assert_eq!(
        (a.max_tokens(), b.max_tokens()),
        ((Some(3), "max_tokens"), (Some(3), "max_new_tokens"))
    );
    assert_eq!(
        (a.min_tokens(), b.min_tokens()),
        ((Some(1), "min_tokens"), (Some(1), "min_new_tokens"))
    );
}
