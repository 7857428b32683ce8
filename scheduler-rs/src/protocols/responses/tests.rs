use serde_json::json;

use super::*;

fn chat(body: Value) -> Result<Map<String, Value>, Refusal> {
    to_chat(body.as_object().unwrap())
}

#[test]
fn input_items_become_chat_messages() {
    let c = chat(json!({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "now", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ], "max_output_tokens": 9, "seed": 3}))
    .unwrap();
    let msgs = c["messages"].as_array().unwrap();
    assert_eq!(msgs[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(msgs[1], json!({"role": "user", "content": "Weather?"}));
    assert_eq!(msgs[2]["role"], "assistant");
    let calls = msgs[2]["tool_calls"].as_array().unwrap();
    assert_eq!(
        calls
            .iter()
            .map(|c| c["function"]["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["get_weather", "now"]
    );
    assert_eq!(
        msgs[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"})
    );
    assert_eq!(msgs[4], json!({"role": "assistant", "content": "Sunny."}));
    assert_eq!(
        (&c["max_tokens"], &c["seed"], &c["model"]),
        (&json!(9), &json!(3), &json!("m"))
    );
    assert!(!c.contains_key("max_output_tokens") && !c.contains_key("instructions"));
    let c = chat(json!({"input": "hi"})).unwrap();
    assert_eq!(c["messages"], json!([{"role": "user", "content": "hi"}]));
}

#[test]
fn tools_choice_and_text_format_take_the_chat_shapes() {
    let c = chat(json!({"input": "x",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}}))
    .unwrap();
    assert_eq!(
        c["tools"],
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}}])
    );
    assert_eq!(
        c["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(
        c["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}})
    );
    let c = chat(
        json!({"input": "x", "text": {"format": {"type": "text"}}, "tool_choice": "required"}),
    )
    .unwrap();
    assert!(!c.contains_key("response_format"));
    assert_eq!(c["tool_choice"], "required");
}

#[test]
fn what_needs_storage_or_is_unknown_is_refused_by_name() {
    let field = |body: Value| chat(body).unwrap_err().0;
    assert_eq!(
        field(json!({"input": "x", "previous_response_id": "resp_1"})),
        "previous_response_id"
    );
    assert_eq!(field(json!({"input": "x", "store": true})), "store");
    assert!(
        chat(json!({"input": "x", "store": false, "background": false, "include": []})).is_ok()
    );
    assert_eq!(field(json!({"input": "x", "messages": []})), "messages");
    assert_eq!(
        field(json!({"input": "x", "reasoning": {"summary": "auto"}})),
        "reasoning.summary"
    );
    let effort = chat(json!({"input": "x", "reasoning": {"effort": "high", "summary": null}}));
    assert_eq!(effort.unwrap()["reasoning_effort"], "high");
    assert_eq!(field(json!({})), "input");
    assert_eq!(
        field(json!({"input": [{"type": "input_image", "image_url": "u"}]})),
        "input[0].type"
    );
    assert_eq!(
        field(json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})),
        "input[0].content"
    );
    assert_eq!(
        field(json!({"input": "x", "tools": [{"type": "web_search"}]})),
        "tools"
    );
    assert_eq!(
        field(json!({"input": "x", "text": {"format": {"type": "xml"}}})),
        "text.format"
    );
    assert_eq!(
        field(json!({"input": "x", "stream_options": {"include_usage": true}})),
        "stream_options"
    );
    assert_eq!(field_name("response_format"), "text.format");
    assert_eq!(field_name("messages[1].content"), "input[1].content");
    assert_eq!(field_name("seed"), "seed");
}
