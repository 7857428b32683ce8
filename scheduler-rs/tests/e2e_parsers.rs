//! `--reasoning-parser`, `--tool-call-parser` and `--enable-auto-tool-choice` end to end:
//! HTTP → router → mock worker → HTTP. The mock echoes its prompt, and the template renders
//! only the last message, so a reply is exactly that message's content (one token a byte:
//! streamed one token a message, every tag arrives cut into pieces).

mod common;

use common::*;
use nitsum_scheduler::config::{OutputParsers, RouterConfig};
use nitsum_scheduler::mock_worker::MockOptions;
use nitsum_scheduler::parsers::reasoning::ReasoningParser;
use nitsum_scheduler::parsers::tool_calls::ToolParser;
use nitsum_scheduler::testutil;
use serde_json::{json, Value};

/// A template that renders only the last message, so the echo is exactly its content.
const LAST_ONLY: &str = "{{ messages[-1]['content'] }}<|im_end|>";

/// A router reading replies with `parsers`, its tiny model's context long enough for calls.
async fn router(parsers: OutputParsers) -> Router {
    let dir = testutil::tiny_model_dir();
    let model_config =
        json!({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512});
    std::fs::write(dir.path().join("config.json"), model_config.to_string()).unwrap();
    let cfg = RouterConfig {
        parsers,
        ..config()
    };
    let one_token_a_message = MockOptions {
        tokens_per_message: 1,
        ..MockOptions::default()
    };
    start_in(cfg, &[one_token_a_message], dir).await
}

fn parsers(reasoning: Option<ReasoningParser>, tools: Option<ToolParser>) -> OutputParsers {
    OutputParsers {
        reasoning,
        tool_calls: tools,
        auto_tool_choice: tools.is_some(),
    }
}

/// A chat request whose reply is `reply`.
fn chat(reply: &str, extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": reply}],
                          "chat_template": LAST_ONLY, "max_tokens": 200});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "now",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}])
}

/// The deltas (with the finish reason, when set) of a streamed chat answer.
fn deltas(resp: &Resp) -> Vec<Value> {
    resp.sse_chunks()
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
        .map(|c| {
            let mut d = c["choices"][0]["delta"].clone();
            if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
                d["finish_reason"] = json!(f);
            }
            d
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_goes_into_reasoning_content_whole_and_streamed() {
    let r = router(parsers(Some(ReasoningParser::DeepSeekR1), None)).await;
    let reply = "<think>ab</think>c";
    let v = post(&r, "/v1/chat/completions", chat(reply, json!({})))
        .await
        .json();
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": "c", "reasoning_content": "ab"}),
        "{v}"
    );
    let resp = post(
        &r,
        "/v1/chat/completions",
        chat(reply, json!({"stream": true})),
    )
    .await;
    // NOTE: no delta holds a piece of a tag: each was held until decided.
    assert_eq!(
        deltas(&resp),
        [
            json!({"role": "assistant", "content": ""}),
            json!({"reasoning_content": "a"}),
            json!({"reasoning_content": "b"}),
            json!({"content": "c"}),
            json!({"finish_reason": "stop"}),
        ]
    );
    // A reply cut inside the think block: all reasoning, content null.
    let cut = chat("hmm </thi", json!({}));
    let v = post(&r, "/v1/chat/completions", cut).await.json();
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": null, "reasoning_content": "hmm </thi"})
    );
    let dropped = chat(reply, json!({"include_reasoning": false, "stream": true}));
    let resp = post(&r, "/v1/chat/completions", dropped).await;
    assert_eq!(
        deltas(&resp),
        [
            json!({"role": "assistant", "content": ""}),
            json!({"content": "c"}),
            json!({"finish_reason": "stop"}),
        ]
    );
    let dropped = chat(reply, json!({"include_reasoning": false}));
    let v = post(&r, "/v1/chat/completions", dropped).await.json();
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": "c", "reasoning_content": null})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_effort_reaches_a_template_that_reads_it_and_is_a_400_otherwise() {
    let r = router(parsers(Some(ReasoningParser::Qwen3), None)).await;
    let mut body = chat("x", json!({"reasoning_effort": "high"}));
    body["chat_template"] = json!("{{ reasoning_effort }}:{{ messages[-1]['content'] }}<|im_end|>");
    let v = post(&r, "/v1/chat/completions", body.clone()).await.json();
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": "high:x", "reasoning_content": null})
    );
    body["reasoning_effort"] = json!("extreme");
    let resp = post(&r, "/v1/chat/completions", body).await;
    assert_eq!(err(&resp), (400, json!("reasoning_effort")));
    let resp = post(
        &r,
        "/v1/chat/completions",
        chat("x", json!({"reasoning_effort": "low"})),
    )
    .await;
    assert_eq!(err(&resp), (400, json!("reasoning_effort")));
    assert!(
        resp.body.contains("does not read `reasoning_effort`"),
        "{}",
        resp.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tool_choice_needs_the_flag_as_in_vllm() {
    let r = router(parsers(None, None)).await;
    for extra in [
        json!({"tools": tools()}),
        json!({"tools": tools(), "tool_choice": "auto"}),
    ] {
        let resp = post(&r, "/v1/chat/completions", chat("x", extra)).await;
        assert_eq!(err(&resp), (400, json!("tool_choice")));
        assert_eq!(
            resp.json()["error"]["message"],
            "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set"
        );
    }
    let none = chat("x", json!({"tools": tools(), "tool_choice": "none"}));
    let v = post(&r, "/v1/chat/completions", none).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_reads_its_calls_whole_and_streamed() {
    let cases = [
        (
            ToolParser::Hermes,
            "<tool_call>{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}</tool_call>",
        ),
        (
            ToolParser::Llama3Json,
            "{\"name\": \"now\", \"parameters\": {\"tz\": \"UTC\"}}",
        ),
        (
            ToolParser::Mistral,
            "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}]",
        ),
        (ToolParser::Pythonic, "[now(tz='UTC')]"),
    ];
    for (parser, reply) in cases {
        let r = router(parsers(None, Some(parser))).await;
        let v = post(
            &r,
            "/v1/chat/completions",
            chat(reply, json!({"tools": tools()})),
        )
        .await
        .json();
        let id = format!("call_{}_0", v["id"].as_str().unwrap());
        let call = json!({"id": id, "type": "function",
                          "function": {"name": "now", "arguments": "{\"tz\":\"UTC\"}"}});
        assert_eq!(
            v["choices"][0],
            json!({"index": 0, "logprobs": null, "finish_reason": "tool_calls",
                   "message": {"role": "assistant", "content": null, "tool_calls": [call]}}),
            "{parser:?}"
        );
        let body = chat(reply, json!({"tools": tools(), "stream": true}));
        let resp = post(&r, "/v1/chat/completions", body).await;
        let chunks = resp.sse_chunks();
        let id = format!("call_{}_0", chunks[0]["id"].as_str().unwrap());
        let call = json!({"id": id, "type": "function", "index": 0,
                          "function": {"name": "now", "arguments": "{\"tz\":\"UTC\"}"}});
        assert_eq!(
            deltas(&resp),
            [
                json!({"role": "assistant", "content": ""}),
                json!({"tool_calls": [call]}),
                json!({"finish_reason": "tool_calls"}),
            ],
            "{parser:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_and_calls_together_in_chat_and_responses() {
    let r = router(parsers(
        Some(ReasoningParser::Qwen3),
        Some(ToolParser::Hermes),
    ))
    .await;
    let reply = "<think>hm</think>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
    let v = post(
        &r,
        "/v1/chat/completions",
        chat(reply, json!({"tools": tools()})),
    )
    .await
    .json();
    let call_id = format!("call_{}_0", v["id"].as_str().unwrap());
    assert_eq!(
        v["choices"][0]["message"],
        json!({"role": "assistant", "content": null, "reasoning_content": "hm",
               "tool_calls": [{"id": call_id, "type": "function",
                               "function": {"name": "now", "arguments": "{}"}}]})
    );
    let stream = chat(reply, json!({"tools": tools(), "stream": true}));
    let d = deltas(&post(&r, "/v1/chat/completions", stream).await);
    assert_eq!(
        d[..3],
        [
            json!({"role": "assistant", "content": ""}),
            json!({"reasoning_content": "h"}),
            json!({"reasoning_content": "m"}),
        ]
    );
    assert_eq!(d[3]["tool_calls"][0]["function"]["name"], "now");
    assert_eq!(d[4], json!({"finish_reason": "tool_calls"}));
    // The Responses API: a reasoning item, then the call.
    let tool = json!({"type": "function", "name": "now", "parameters": {"type": "object"}});
    let mut body = json!({"model": "tiny", "input": reply, "tools": [tool],
                          "max_output_tokens": 200, "chat_template": LAST_ONLY});
    let v = post(&r, "/v1/responses", body.clone()).await.json();
    let reasoning_of = |response: &Value| {
        let n = &response["id"].as_str().unwrap()["resp_".len()..];
        json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": [],
               "content": [{"type": "reasoning_text", "text": "hm"}],
               "encrypted_content": null, "status": "completed"})
    };
    assert_eq!(v["output"][0], reasoning_of(&v), "{v}");
    assert_eq!(
        (
            v["output"][1]["type"].as_str(),
            v["output"][1]["name"].as_str()
        ),
        (Some("function_call"), Some("now"))
    );
    assert_eq!(v["output"].as_array().unwrap().len(), 2);
    body["stream"] = json!(true);
    let events = post(&r, "/v1/responses", body).await.sse_chunks();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let reasoning = reasoning_of(&events[0]["response"]);
    assert_eq!(events[4]["delta"], "h");
    assert_eq!(events[6]["text"], "hm");
    assert_eq!(events[8]["item"], reasoning);
    assert_eq!(events[13]["response"]["output"][0], reasoning);
    // `reasoning.effort` is the template's `reasoning_effort`, echoed back.
    let effort = json!({"model": "tiny", "input": "x", "reasoning": {"effort": "low"},
                        "chat_template": LAST_ONLY});
    let resp = post(&r, "/v1/responses", effort.clone()).await;
    assert_eq!(err(&resp), (400, json!("reasoning.effort")));
    let mut effort = effort;
    effort["chat_template"] = json!("{{ reasoning_effort }}<|im_end|>");
    let v = post(&r, "/v1/responses", effort).await.json();
    assert_eq!(v["output"][0]["content"][0]["text"], "low", "{v}");
    assert_eq!(v["reasoning"], json!({"effort": "low"}));
}
