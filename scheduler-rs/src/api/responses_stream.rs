//! The Responses API event stream (`stream: true`): `response.created`,
//! `response.in_progress`, then per output item `response.output_item.added`, its content
//! events (`response.output_text.delta`/`.done` for a message, `response.function_call_arguments.delta`/`.done`
//! for a call) and `response.output_item.done`, and last `response.completed` (or
//! `response.incomplete`) with the whole response and its usage. Every event carries its
//! `type` and a `sequence_number` counting from 0.

use serde_json::{json, Value};

use super::output::{Piece, TextStream};
use super::response_object::{self as obj, ResponseMeta};
use super::sse::ChunkFormat;
use super::tool_reply::CallFormat;

/// The events of one response (one choice: the Responses API has no `n`).
pub struct ResponseEvents {
    meta: ResponseMeta,
    /// Set when tool calls are read: the text is held back until the end (a call is only
    /// known once complete), then every item goes out whole.
    calls: Option<CallFormat>,
    seq: u64,
    text: String,
    output: Vec<Value>,
    status: &'static str,
}

impl ResponseEvents {
    pub fn new(meta: ResponseMeta, calls: Option<CallFormat>) -> Self {
        ResponseEvents {
            meta,
            calls,
            seq: 0,
            text: String::new(),
            output: Vec::new(),
            status: "completed",
        }
    }

    fn event(&mut self, kind: &str, fields: Value) -> Value {
        let mut e = json!({"type": kind, "sequence_number": self.seq});
        self.seq += 1;
        if let (Some(e), Value::Object(f)) = (e.as_object_mut(), fields) {
            e.extend(f);
        }
        e
    }

    /// The events that open the message item (output index `index`).
    fn open_message(&mut self, index: usize) -> Vec<Value> {
        let item = obj::message_item(&self.meta, None, "in_progress");
        let id = self.meta.message_id();
        vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ),
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": obj::output_text("")}),
            ),
        ]
    }

    fn text_delta(&mut self, index: usize, delta: &str) -> Value {
        let id = self.meta.message_id();
        self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta,
                   "logprobs": []}),
        )
    }

    /// The events that close the finished message item `item` (output index `index`).
    fn close_message(&mut self, index: usize, item: &Value) -> Vec<Value> {
        let id = self.meta.message_id();
        let text = item["content"][0]["text"].clone();
        vec![
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                       "logprobs": []}),
            ),
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": item["content"][0]}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]
    }

    /// The whole event sequence of a finished `function_call` item.
    fn call_events(&mut self, index: usize, item: &Value) -> Vec<Value> {
        let mut added = item.clone();
        added["arguments"] = json!("");
        added["status"] = json!("in_progress");
        let (id, args) = (item["id"].clone(), item["arguments"].clone());
        vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            ),
            self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": args}),
            ),
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": args,
                       "name": item["name"]}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]
    }
}

impl ChunkFormat for ResponseEvents {
    fn start(&mut self, _index: usize, _ts: &TextStream) -> Vec<Value> {
        let response = self.meta.object("in_progress", &[], Value::Null);
        let mut out = vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ];
        if self.calls.is_none() {
            out.extend(self.open_message(0));
        }
        out
    }

    fn piece(&mut self, _index: usize, _ts: &TextStream, p: &Piece) -> Vec<Value> {
        self.text.push_str(&p.text);
        let mut out = Vec::new();
        if self.calls.is_none() && !p.text.is_empty() {
            out.push(self.text_delta(0, &p.text));
        }
        let Some(finish) = p.finish else {
            return out;
        };
        self.status = obj::status(finish);
        let text = std::mem::take(&mut self.text);
        let items = obj::output_items(&self.meta, self.calls, text, finish);
        for (index, item) in items.iter().enumerate() {
            if item["type"] == "function_call" {
                out.extend(self.call_events(index, item));
                continue;
            }
            if self.calls.is_some() {
                // NOTE: held back: the message opens now, its text in one delta.
                out.extend(self.open_message(index));
                let text = item["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if !text.is_empty() {
                    out.push(self.text_delta(index, &text));
                }
            }
            out.extend(self.close_message(index, item));
        }
        self.output = items;
        out
    }

    fn end(&mut self, all: &[TextStream]) -> Vec<Value> {
        let response = self.meta.object(self.status, &self.output, obj::usage(all));
        let kind = format!("response.{}", self.status);
        vec![self.event(&kind, json!({"response": response}))]
    }
}
