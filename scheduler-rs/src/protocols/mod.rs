//! Wire types: the OpenAI-compatible HTTP API, the router ↔ worker messages and the router ↔
//! router ones (`peer`).

pub mod body;
pub mod extensions;
pub mod grammar_probe;
pub mod http_replies;
pub mod native;
pub mod openai;
pub mod peer;
#[cfg(test)]
mod peer_tests;
pub mod responses;
pub mod sampling_fields;
pub mod structured;
pub mod tool_calls;
pub mod tool_prompt;
pub mod tools;
pub mod vllm_fields;
#[cfg(test)]
mod wire_golden;
pub mod worker;
pub mod worker_stats;
