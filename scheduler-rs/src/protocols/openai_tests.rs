//! The OpenAI request types: typed fields, named errors, both shapes of `prompt` and `stop`.

use super::*;
use crate::protocols::body::parse_body;

#[test]
fn a_type_error_names_its_field_even_inside_flattened_fields() {
    let e = parse_body::<ChatCompletionRequest>(br#"{"messages": [], "seed": "abc"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("seed"), "{e:?}");
    let body = b"{\"model\": \"m\",\n \"stream_options\": {\"include_usage\": \"no\"}}";
    let e = parse_body::<ChatCompletionRequest>(body).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("stream_options"));
    let e = parse_body::<ChatCompletionRequest>(br#"{"messages": "hi"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages"));
    let e = parse_body::<ChatCompletionRequest>(b"{not json").unwrap_err();
    assert_eq!(e.param, None);
}

#[test]
fn bytes_after_the_json_value_are_refused() {
    for body in [
        &br#"{"model": "m"} {"model": "n"}"#[..],
        br#"{"model": "m"}garbage"#,
        br#"{"model": "m"}]"#,
    ] {
        let e = parse_body::<ChatCompletionRequest>(body).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("after the JSON value"), "{e:?}");
        assert_eq!(e.code, Some("invalid_json"));
    }
    // Whitespace after the value is not content.
    let ok = parse_body::<ChatCompletionRequest>(b"{\"model\": \"m\"}\r\n \t");
    assert_eq!(ok.unwrap().common.model.as_deref(), Some("m"));
}

#[test]
fn sampling_and_structured_fields_are_typed_and_only_the_rest_is_refused() {
    let c: CommonParams = serde_json::from_value(serde_json::json!({
        "logprobs": true, "top_logprobs": 2, "presence_penalty": 0.5,
        "frequency_penalty": 0.1, "repetition_penalty": 1.1, "logit_bias": {"5": 1.0},
        "min_tokens": 1, "min_p": 0.1, "n": 2,
        "response_format": {"type": "json_object"}, "tools": [], "tool_choice": "auto",
        "best_of": 1, "user": "u",
    }))
    .unwrap();
    // Every implemented field was taken by its typed member: `extra` holds `user` only.
    assert_eq!(c.extra.keys().collect::<Vec<_>>(), ["user"]);
    assert_eq!(unsupported(&c), None);
    let refused = |body: serde_json::Value| {
        unsupported(&serde_json::from_value(body).unwrap()).map(|(name, _)| name)
    };
    assert_eq!(
        refused(serde_json::json!({"min_p": 0.1, "best_of": 2})).as_deref(),
        Some("best_of")
    );
    assert_eq!(
        refused(serde_json::json!({"logprobs": 3, "suffix": "x"})).as_deref(),
        Some("suffix")
    );
    assert_eq!(
        refused(serde_json::json!({"min_p": 0.1, "temprature": 1})).as_deref(),
        Some("temprature")
    );
}

#[test]
fn prompt_and_stop_accept_both_shapes() {
    let r: CompletionRequest =
        serde_json::from_str(r#"{"prompt": [1, 2], "stop": "x", "tier": "strict"}"#).unwrap();
    assert_eq!(r.prompt, Some(Prompt::Ids(vec![1, 2])));
    assert_eq!(r.common.stop.unwrap().into_vec(), ["x"]);
    assert_eq!(r.common.tier.as_deref(), Some("strict"));
    let r: CompletionRequest =
        serde_json::from_str(r#"{"prompt": "hi", "stop": ["a", "b"], "foo": 1}"#).unwrap();
    assert_eq!(r.prompt, Some(Prompt::Text("hi".into())));
    assert_eq!(r.common.stop.unwrap().into_vec(), ["a", "b"]);
    let chat: ChatCompletionRequest = serde_json::from_str(
        r#"{"model": "m", "messages": [{"role": "user", "content": "hi", "name": "x"}]}"#,
    )
    .unwrap();
    let msgs = chat.messages.unwrap();
    assert_eq!(msgs[0].extra["name"], "x");
    assert!(serde_json::from_str::<CompletionRequest>(r#"{"temperature": "hot"}"#).is_err());
}
