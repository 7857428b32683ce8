//! Wire types: the OpenAI-compatible HTTP API and the router ↔ worker messages.

pub mod body;
pub mod extensions;
pub mod grammar_probe;
pub mod native;
pub mod openai;
pub mod responses;
pub mod structured;
pub mod tool_calls;
pub mod tool_prompt;
pub mod tools;
pub mod vllm_fields;
#[cfg(test)]
mod wire_golden;
pub mod worker;
pub mod worker_stats;
