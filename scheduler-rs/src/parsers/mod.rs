//! Parsers of a model's output text (pure functions and state machines over text, no I/O):
//! reasoning (`--reasoning-parser`) and tool calls (`--tool-call-parser`). The API layer
//! wires them into replies (api/chat.rs, api/tool_reply.rs, api/responses_stream.rs).

pub mod reasoning;
pub mod tool_calls;
