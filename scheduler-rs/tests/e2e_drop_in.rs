//! What vLLM and SGLang clients send and Nitsum refused (issue 40 item 9): a request without
//! `model`, lm-eval's `GET /tokenizer_info`, and SGLang's prompt-only `/generate`
//! (`max_new_tokens: 0`, sent by `sgl.select` and the frontend's prefix caching).

mod common;

use common::*;
use nitsum_scheduler::mock_worker::MockOptions;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_model_is_served_by_the_one_model() {
    let r = start(config(), &[MockOptions::default()]).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let resp = post(&r, "/v1/chat/completions", chat).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["model"], "tiny");
    let resp = post(
        &r,
        "/v1/completions",
        json!({"prompt": "ab", "max_tokens": 2}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["choices"][0]["text"], "ab");
    // Another model's name is still refused.
    let resp = post(
        &r,
        "/v1/completions",
        json!({"model": "gpt-9", "prompt": "ab"}),
    )
    .await;
    assert_eq!(err(&resp), (404, json!("model")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_info_has_what_lm_evals_remote_tokenizer_reads() {
    let r = start(config(), &[MockOptions::default()]).await;
    let resp = call(&r, "GET", "/tokenizer_info", &[], "").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let info = resp.json();
    // The tiny model's tokenizer_config.json: no BOS, ChatML's end as EOS.
    assert_eq!(info["eos_token"], "<|im_end|>");
    assert_eq!(info["bos_token"], Value::Null);
    assert_eq!(info["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(
        info["chat_template"],
        nitsum_scheduler::testutil::CHATML,
        "the template in use"
    );
    // lm-eval then encodes with /tokenize (its payload) and checks `tokens`.
    let t = post(
        &r,
        "/tokenize",
        json!({"prompt": "ab", "add_special_tokens": false}),
    )
    .await;
    assert_eq!(t.json()["tokens"], json!([97, 98]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_with_no_new_tokens_answers_the_prompt_alone() {
    let r = start(config(), &[MockOptions::default()]).await;
    // sgl.select's first request: the prompt's length, nothing generated.
    let one = json!({"text": "abcd", "sampling_params": {"max_new_tokens": 0}});
    let resp = post(&r, "/generate", one.clone()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let out = resp.json();
    assert_eq!((&out["text"], &out["output_ids"]), (&json!(""), &json!([])));
    let meta = &out["meta_info"];
    assert_eq!(
        (&meta["prompt_tokens"], &meta["completion_tokens"]),
        (&json!(4), &json!(0))
    );
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 0})
    );
    // Its second: a batch of prompt + choice, with logprobs: a list, each without output.
    let two = json!({
        "text": ["abcd x", "abcd yz"],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": true,
        "return_text_in_logprobs": true,
        "logprob_start_len": 2,
    });
    let resp = post(&r, "/generate", two).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let outs = resp.json();
    let outs = outs.as_array().expect("a batch answers a list");
    assert_eq!(outs.len(), 2);
    for (o, prompt) in outs.iter().zip([6, 7]) {
        assert_eq!(o["text"], "");
        assert_eq!(o["meta_info"]["output_token_logprobs"], json!([]));
        assert_eq!(o["meta_info"]["completion_tokens"], 0);
        assert_eq!(o["meta_info"]["prompt_tokens"], prompt);
    }
    // Streamed: one chunk, with no output either.
    let mut streamed = one;
    streamed["stream"] = json!(true);
    let chunks = post(&r, "/generate", streamed).await.sse_chunks();
    assert_eq!(chunks.len(), 1, "{chunks:?}");
    assert_eq!(
        (&chunks[0]["text"], &chunks[0]["output_ids"]),
        (&json!(""), &json!([]))
    );
}
