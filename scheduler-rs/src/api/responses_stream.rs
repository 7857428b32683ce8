//! The Responses API event stream (`stream: true`): `response.created`,
//! `response.in_progress`, then per output item `response.output_item.added`, its content
//! events (`response.reasoning_text.delta`/`.done` for reasoning, `response.output_text.delta`/`.done`
//! for a message, `response.function_call_arguments.delta`/`.done` for a call) and
//! `response.output_item.done`, and last `response.completed` (or `response.incomplete`)
//! with the whole response and its usage. Every event carries its `type` and a
//! `sequence_number` counting from 0.

use serde_json::{json, Value};

use super::output::{Piece, TextStream};
use super::reading::Reading;
use super::reasoning_reply::ReasoningPieces;
use super::response_object::{self as obj, ResponseMeta};
use super::sse::ChunkFormat;

/// The events of one response (one choice: the Responses API has no `n`).
pub struct ResponseEvents {
    meta: ResponseMeta,
    /// How the text is read. With tool calls the content is held back until the end (a call
    /// is only known once complete), then every content item goes out whole; reasoning
    /// streams as it is decided.
    reading: Reading,
    pieces: Option<ReasoningPieces>,
    seq: u64,
    /// The reasoning so far, and its item's output index once opened.
    reasoning: String,
    reasoning_at: Option<usize>,
    /// Whether the reasoning item was closed (content followed it).
    reasoning_done: bool,
    /// The content so far, and the streamed message item's output index once opened.
    text: String,
    message_at: Option<usize>,
    output: Vec<Value>,
    status: &'static str,
}

impl ResponseEvents {
    pub fn new(meta: ResponseMeta, reading: Reading) -> Self {
        ResponseEvents {
            meta,
            pieces: reading.pieces(),
            reading,
            seq: 0,
            reasoning: String::new(),
            reasoning_at: None,
            reasoning_done: false,
            text: String::new(),
            message_at: None,
            output: Vec::new(),
            status: "completed",
        }
    }

    /// The output index the next item opens at.
    fn next_index(&self) -> usize {
        usize::from(self.reasoning_at.is_some()) + usize::from(self.message_at.is_some())
    }

    /// The events that open the reasoning item (output index `index`).
    fn open_reasoning(&mut self, index: usize) -> Vec<Value> {
        let item = obj::reasoning_item(&self.meta, None, "in_progress");
        let id = self.meta.reasoning_id();
        self.open_item(index, item, id, obj::reasoning_text(""))
    }

    /// `output_item.added` for `item`, then `content_part.added` for its empty first `part`.
    fn open_item(&mut self, index: usize, item: Value, id: String, part: Value) -> Vec<Value> {
        vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ),
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ),
        ]
    }

    /// `content_part.done` for `item`'s first part, then `output_item.done`.
    fn close_item(&mut self, index: usize, id: &str, item: &Value) -> [Value; 2] {
        [
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

    /// The events that close the reasoning item, with its status.
    fn close_reasoning(&mut self, status: &str) -> Vec<Value> {
        let Some(index) = self.reasoning_at.filter(|_| !self.reasoning_done) else {
            return Vec::new();
        };
        self.reasoning_done = true;
        let item = obj::reasoning_item(&self.meta, Some(&self.reasoning), status);
        let id = self.meta.reasoning_id();
        let done = self.event(
            "response.reasoning_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "text": self.reasoning}),
        );
        let mut out = vec![done];
        out.extend(self.close_item(index, &id, &item));
        out
    }

    /// Reasoning decided by a piece: opens the item first, then a delta.
    fn reasoning_delta(&mut self, delta: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let index = match self.reasoning_at {
            Some(i) => i,
            None => {
                let i = self.next_index();
                out.extend(self.open_reasoning(i));
                self.reasoning_at = Some(i);
                i
            }
        };
        self.reasoning.push_str(delta);
        let id = self.meta.reasoning_id();
        out.push(self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
        out
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
        self.open_item(index, item, id, obj::output_text(""))
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
        let done = self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                   "logprobs": []}),
        );
        let mut out = vec![done];
        out.extend(self.close_item(index, &id, item));
        out
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
        if self.reading == Reading::default() {
            // NOTE: plain text: the message is the only item and opens at once.
            out.extend(self.open_message(0));
            self.message_at = Some(0);
        }
        out
    }

    fn piece(&mut self, _index: usize, _ts: &TextStream, p: &Piece) -> Vec<Value> {
        let split = match self.pieces.as_mut() {
            Some(r) => r.push(&p.text, p.finish.is_some()),
            None => crate::parsers::reasoning::Split {
                reasoning: String::new(),
                content: p.text.clone(),
            },
        };
        let mut out = Vec::new();
        if !split.reasoning.is_empty() {
            out.extend(self.reasoning_delta(&split.reasoning));
        }
        self.text.push_str(&split.content);
        if self.reading.calls.is_none() && !split.content.is_empty() {
            out.extend(self.close_reasoning("completed"));
            let index = match self.message_at {
                Some(i) => i,
                None => {
                    let i = self.next_index();
                    out.extend(self.open_message(i));
                    self.message_at = Some(i);
                    i
                }
            };
            out.push(self.text_delta(index, &split.content));
        }
        let Some(finish) = p.finish else {
            return out;
        };
        self.status = obj::status(finish);
        let text = std::mem::take(&mut self.text);
        out.extend(self.close_reasoning(obj::reasoning_status(&text, finish)));
        let status = obj::reasoning_status(&text, finish);
        let mut items = obj::content_items(&self.meta, self.reading.calls, text, finish);
        if let Some(at) = self.reasoning_at {
            // NOTE: at 0 unless a message streamed before the think block (Qwen3 text before
            // `<think>`); a whole reply puts it first always.
            let item = obj::reasoning_item(&self.meta, Some(&self.reasoning), status);
            items.insert(at.min(items.len()), item);
        }
        for (index, item) in items.iter().enumerate() {
            if item["type"] == "reasoning" {
                continue; // closed above
            }
            if item["type"] == "function_call" {
                out.extend(self.call_events(index, item));
                continue;
            }
            if self.message_at.is_none() {
                // NOTE: held back (or never begun): the message opens now, its text in one
                // delta.
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
